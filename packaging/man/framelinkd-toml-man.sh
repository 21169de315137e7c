#!/usr/bin/env bash
# Writes framelinkd.toml(5) from the daemon's own option table, so that the page lists
# exactly the keys the daemon reads:
#   framelinkd-toml-man.sh FRAMELINKD VERSION OUTPUT
# FRAMELINKD --print-config-reference prints the markdown table docs/reference/configuration.md carries
# (key | flag | default | meaning); each row becomes an entry under its section.
set -euo pipefail
daemon=$1 version=$2 out=$3
table=$("$daemon" --print-config-reference)
[[ -n "$table" ]] || { echo "$daemon --print-config-reference printed nothing" >&2; exit 1; }

{
  cat <<HEAD
.TH FRAMELINKD.TOML 5 "" "framelinkd $version" "File Formats"
.SH NAME
framelinkd.toml \- configuration file of framelinkd
.SH SYNOPSIS
.B /etc/framelink/framelinkd.toml
.SH DESCRIPTION
.B framelinkd
reads this TOML file when started with
.BR "\-\-config " \fIFILE\fR
(the packaged unit passes /etc/framelink/framelinkd.toml).
Every key has a command-line flag of the same meaning; a flag given on the command line
overrides the file.
.B \-\-allowed\-uids\fR, \fB\-\-allowed\-gids
and
.B \-\-transports
replace the file's lists;
.B \-\-peer
adds a peer or replaces the address of the file's peer of the same name, and
.B \-\-route
adds a stream to a peer (\fBSTREAM=PEER1,PEER2\fR: to each of them).
Relative file names in the file are relative to the file's directory.
Sizes (BYTES) are written as numbers or as strings such as "4MiB".
.PP
The keys below are listed by section, each with its flag, its default and its meaning;
.B framelinkd \-\-print\-config\-reference
prints the same table.
HEAD
  # Cells are split on " | "; a "|" inside a cell is written "\|" in markdown.
  awk -v SEP=$'\x1f' '
    function roff(s) {
      gsub(/\\\|/, "|", s)
      gsub(/\\/, "\\e", s)
      gsub(/`/, "", s)
      gsub(/-/, "\\-", s)
      sub(/^\./, "\\\\\\&.", s)
      sub(/^'"'"'/, "\\\\\\&'"'"'", s)
      return s
    }
    /^\| *key *\|/ || /^\|---/ { next }
    /^\|/ {
      line = $0
      gsub(/\\\|/, SEP, line)
      sub(/^\| */, "", line); sub(/ *\| *$/, "", line)
      n = split(line, c, / *\| */)
      for (i = 1; i <= n; i++) gsub(SEP, "\\|", c[i])
      key = c[1]; flag = c[2]; def = c[3]; text = c[4]
      gsub(/`/, "", key)
      rows++
      if (!match(key, /^\[\[?[a-z_]+\]\]?/)) {
        # --config and the flags that have no key (tests only): after the sections.
        cmdline = cmdline ".TP\n.B " roff(flag) "\n" roff(text) ".\n"
        if (def != "") cmdline = cmdline ".br\nDefault: " roff(def) ".\n"
        next
      }
      section = substr(key, RSTART, RLENGTH)
      name = substr(key, RLENGTH + 1); sub(/^ +/, "", name)
      if (section != last) {
        if (section ~ /^\[\[/) print ".SH " section " TABLES"
        else print ".SH SECTION " section
        last = section
      }
      print ".TP"
      print ".B " roff(name)
      print roff(text) "."
      print ".br"
      print (section ~ /^\[\[/ ? "Flags: " : "Flag: ") roff(flag) "."
      if (def == "-") def = "unset"
      if (def != "") print "Default: " roff(def) "."
    }
    END {
      if (rows == 0) { print "no table rows" > "/dev/stderr"; exit 1 }
      if (cmdline != "") printf ".SH COMMAND-LINE ONLY\nFlags of framelinkd that have no key in the file:\n%s", cmdline
    }
  ' <<<"$table"
  cat <<'TAIL'
.SH EXAMPLE
.nf
[daemon]
id = "host\-a"
socket_group = "framelink"

[link]
listen = "0.0.0.0:7700"
token_file = "/etc/framelink/peer.token"

[[peer]]
name = "host\-b"
address = "10.0.0.2:7700"
streams = ["cam0", "*"]
.fi
.SH FILES
.TP
.I /etc/framelink/framelinkd.toml
The file the packaged framelinkd.service reads.
.TP
.I /etc/framelink/peer.token
The shared secret peers present (link.token_file), made by the package.
.TP
.I /etc/framelink/tls/
This host's TLS certificate and key (host.crt, host.key) and the peers' certificates
(peers.pem), made by the package.
.SH SEE ALSO
.BR framelinkd (8),
.BR framelink (1)
TAIL
} >"$out.tmp"
mv "$out.tmp" "$out"
