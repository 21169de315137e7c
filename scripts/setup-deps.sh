#!/usr/bin/env bash
# Installs the Debian packages that building, testing and CI need, in named sets:
#   build   what debian/control's Build-Depends lists: all a package build needs (one source: the
#           control file; checked with dpkg-checkbuilddeps, installed with `apt-get build-dep ./`)
#   tests   the test and CI tools on top: the test framework, clang and its sanitizers, the style
#           and house checks, the package checks (lintian, rpm), the Python client's tests, MkDocs
#   guests  (--softroce) the QEMU guests: the Soft-RoCE lane (rdma_rxe), the service test
#           (debootstrap, a clean Debian 12 with systemd), the container image and its test (podman)
# Idempotent: when everything is already installed it touches nothing (no apt at all), so the
# set-up commands and .ci/run can call it on every run.
#
#   scripts/setup-deps.sh              build + tests (what scripts/build.sh and scripts/test.sh need)
#   scripts/setup-deps.sh --build      build only: enough for dpkg-buildpackage
#   scripts/setup-deps.sh --softroce   build + tests + guests (CI)
#   scripts/setup-deps.sh --check      only report what is missing (exit 1 if anything is)
set -euo pipefail

usage() { sed -n '2,16s/^# \{0,1\}//p' "$0"; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

softroce=0
check_only=0
build_only=0
for arg in "$@"; do
  case "$arg" in
    --softroce) softroce=1 ;;
    --build) build_only=1 ;;
    --check) check_only=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "setup-deps: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done
((build_only && softroce)) && { echo "setup-deps: --build and --softroce exclude each other" >&2; exit 2; }

# ---- tests: on top of the build dependencies (debian/control names the compilers' inputs: CMake,
# gRPC, rdma-core, ...; nothing of it is repeated here)
packages=(
  # toolchain: the compilers (build-dep brings them too) and ccache, which every build tree uses
  build-essential ccache
  # rdma transport at run time: the user-space providers (rxe, mlx5, ...) the tests load
  rdma-core ibverbs-providers
  # `framelink-bench run` and tests/softroce/bench.sh: UCX's ucx_perftest (tag_bw / tag_lat), the UCX
  # baseline beside framelink (UCX_TLS=tcp on loopback; rc_verbs on the Soft-RoCE devices)
  ucx-utils
  # `framelink-bench run`: sockperf's ping-pong, the raw-TCP one-way latency beside framelink's
  sockperf
  # tests, the style check in CI and the libFuzzer targets (scripts/fuzz.sh, whose clang
  # build also runs the thread-safety analysis)
  catch2 clang-format clang-14 libclang-rt-14-dev
  # clang-tidy with the repository's .clang-tidy (scripts/tidy.sh)
  clang-tidy-14
  # scripts/check-house.sh: universal-ctags finds where each function starts and ends (its JSON
  # output with end lines) for the house's function-size limit
  universal-ctags
  # certificates for the TLS integration tests
  openssl
  # the fleet's registry in the discovery tests: a real etcd (its JSON gateway; the daemon speaks
  # it over cpp-httplib), started by the tests themselves (the package's own service is not used)
  etcd-server
  # the fleet's other registry, DNS SRV records: dnsmasq (its --srv-host), run by the tests themselves
  dnsmasq-base
  # the Python client's tests and its optional numpy views (/usr/bin/python3)
  python3 python3-numpy python3-pytest
  # unit.metrics_exposition: /metrics read by Prometheus' own parser, the alert rules as YAML
  python3-prometheus-client python3-yaml
  # scripts/package.sh's checks: rpm's rpmbuild (packaging/rpm/framelink.spec; debugedit and elfutils'
  # eu-strip make the -debuginfo rpms), lintian and rpmlint
  rpm debugedit elfutils lintian rpmlint
  # install.abi: libframelink's ABI against the last release's (abidiff, abidw)
  abigail-tools
  # the Python client as a wheel, built offline (setuptools backend + wheel, pip without build
  # isolation) and installed into a venv for its tests; mypy checks its type hints (py.typed)
  python3-venv python3-pip python3-wheel mypy
  # (mkdocs, which scripts/check-docs.sh runs, is a build dependency: framelink-doc is the site)
)
((build_only)) && packages=()
if ((softroce)); then
  packages+=(
    # a throw-away QEMU guest running Debian's kernel, which has rdma_rxe
    qemu-system-x86 linux-image-amd64 busybox-static kmod cpio iproute2
    # verbs tools and perftest (ib_write_bw baseline) inside the guest
    ibverbs-utils rdmacm-utils perftest
    # the service test (tests/service): a clean Debian 12 root file system made by debootstrap,
    # written to an ext4 image with mke2fs -d, booted with the same QEMU and kernel
    debootstrap e2fsprogs
    # the container image (packaging/container/build-image.sh: a debootstrap root imported with
    # podman) and its test (tests/container): runc runs the containers where crun cannot
    podman runc
  )
fi

# The .NET client needs the .NET SDK (10.0 or later: FrameLink builds for net10.0), which is
# not a Debian package: say so loudly.
if ! command -v dotnet >/dev/null 2>&1; then
  echo "setup-deps: WARNING: dotnet (the .NET SDK) is not installed; client/dotnet and its tests need it" >&2
  echo "  (scripts/test.sh fails without it; install the SDK, e.g. from Microsoft's Debian repository)" >&2
fi

# build: debian/control's Build-Depends, as dpkg-checkbuilddeps (dpkg-dev) reads them: versions and
# the virtual dh-sequence-* names included.
build_missing=0
if ! command -v dpkg-checkbuilddeps >/dev/null || ! (cd "$root" && dpkg-checkbuilddeps >"${TMPDIR:-/tmp}/setup-deps.$$" 2>&1); then
  build_missing=1
fi
unmet=$(sed -n 's/.*Unmet build dependencies: //p' "${TMPDIR:-/tmp}/setup-deps.$$" 2>/dev/null || true)
rm -f "${TMPDIR:-/tmp}/setup-deps.$$"

# tests (and guests): one dpkg-query for all: packages it does not know are simply absent from its output.
declare -A installed=()
while read -r name status; do
  [[ "$status" == "installed" ]] && installed[${name%%:*}]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${packages[@]}" 2>/dev/null || true)
missing=()
for pkg in "${packages[@]}"; do
  [[ -n "${installed[$pkg]:-}" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0 && build_missing == 0)); then
  echo "setup-deps: debian/control's build dependencies and all ${#packages[@]} other packages are installed"
  exit 0
fi
((build_missing == 0)) || echo "setup-deps: build dependencies (debian/control) missing: ${unmet:-dpkg-dev, to check them}"
((${#missing[@]} == 0)) || echo "setup-deps: missing: ${missing[*]}"
if ((check_only)); then
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo -n)  # never prompt: CI has no terminal
else
  echo "setup-deps: need root (or sudo) to install: ${unmet:-} ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
if ((build_missing)); then
  # apt reads the unpacked source's debian/control (and brings build-essential with it).
  (cd "$root" && "${sudo[@]}" apt-get build-dep -y -qq ./ </dev/null)
  echo "setup-deps: installed the build dependencies of debian/control"
fi
if ((${#missing[@]} > 0)); then
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
  echo "setup-deps: installed ${missing[*]}"
fi
