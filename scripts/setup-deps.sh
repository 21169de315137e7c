#!/usr/bin/env bash
# Installs every Debian package that building, testing and CI need.
# Idempotent: when everything is already installed it touches nothing (no apt
# at all), so the set-up commands and .ci/run can call it on every run.
#
#   scripts/setup-deps.sh              build + tests + CI
#   scripts/setup-deps.sh --softroce   also the QEMU guests: the Soft-RoCE lane (rdma_rxe) and the
#                                      service test (debootstrap, a clean Debian 12 with systemd),
#                                      and the container image and its test (podman, runc)
#   scripts/setup-deps.sh --check      only report what is missing (exit 1 if anything is)
set -euo pipefail

usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }

softroce=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --softroce) softroce=1 ;;
    --check) check_only=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "setup-deps: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config ccache
  # peer link (gRPC control + grpc data fallback) and its generated code
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # daemon libraries
  libnuma-dev libspdlog-dev libcli11-dev libtomlplusplus-dev libcpp-httplib-dev libsystemd-dev
  # the daemon's /metrics: Prometheus' text format (prometheus-cpp's TextSerializer)
  prometheus-cpp-dev
  # the framelink tool: parsing the daemon's admin snapshots (JSON)
  nlohmann-json3-dev
  # `framelink-bench run` and tests/softroce/bench.sh: UCX's ucx_perftest (tag_bw / tag_lat), the UCX
  # baseline beside framelink (UCX_TLS=tcp on loopback; rc_verbs on the Soft-RoCE devices)
  ucx-utils
  # rdma transport (rdma-core): headers, libraries and the user-space providers (rxe, mlx5, ...)
  libibverbs-dev librdmacm-dev rdma-core ibverbs-providers
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
  # the Python client's tests and its optional numpy views (/usr/bin/python3)
  python3 python3-numpy python3-pytest
  # unit.metrics_exposition: /metrics read by Prometheus' own parser, the alert rules as YAML
  python3-prometheus-client python3-yaml
  # scripts/package.sh: debhelper (dpkg-buildpackage with debian/; dpkg-dev comes with
  # build-essential), rpm's rpmbuild (packaging/rpm/framelink.spec; debugedit and elfutils'
  # eu-strip make the -debuginfo rpms), lintian and rpmlint, help2man for the packages' manual
  # pages (from --help)
  debhelper rpm debugedit elfutils lintian rpmlint help2man
  # the Python client as a wheel, built offline (setuptools backend + wheel, pip without build
  # isolation) and installed into a venv for its tests; mypy checks its type hints (py.typed)
  python3-venv python3-pip python3-setuptools python3-wheel mypy
  # the documentation site (mkdocs.yml, docs/): scripts/check-docs.sh builds it with --strict
  mkdocs
)
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

# The .NET client needs the .NET SDK (10.0 or later: FrameLink builds for net8.0 and net10.0), which is
# not a Debian package: say so loudly.
if ! command -v dotnet >/dev/null 2>&1; then
  echo "setup-deps: WARNING: dotnet (the .NET SDK) is not installed; client/dotnet and its tests need it" >&2
  echo "  (scripts/test.sh fails without it; install the SDK, e.g. from Microsoft's Debian repository)" >&2
fi

# One dpkg-query for all: packages it does not know are simply absent from its output.
declare -A installed=()
while read -r name status; do
  [[ "$status" == "installed" ]] && installed[${name%%:*}]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${packages[@]}" 2>/dev/null || true)
missing=()
for pkg in "${packages[@]}"; do
  [[ -n "${installed[$pkg]:-}" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "setup-deps: all ${#packages[@]} packages are installed"
  exit 0
fi
echo "setup-deps: missing: ${missing[*]}"
if ((check_only)); then
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo -n)  # never prompt: CI has no terminal
else
  echo "setup-deps: need root (or sudo) to install: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
echo "setup-deps: installed ${missing[*]}"
