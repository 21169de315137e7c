// The value syntaxes of framelinkd's settings, shared by the TOML file and
// the command line so that both accept the same text and refuse it with the
// same message.  `label` names the setting in messages: "--max-slots" or
// "limits.max_slots (line 3 of /etc/framelink/framelinkd.toml)"; every
// message also quotes the value that was refused.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace framelink {

Error invalidSetting(std::string message);
// "unknown key 'daemon.sokcet' (line 2 of f.toml); did you mean 'daemon.socket'? The configuration ...":
// `where` says where it was written, `guess` is "; did you mean ...?" or "".
Error unknownKey(const std::string& key, const std::string& where, const std::string& guess);

// A decimal number within [min, max].
Result<uint64_t> parseNumber(const std::string& text, const std::string& label, uint64_t min, uint64_t max);

// Byte counts: a plain number, or a number with a binary suffix K/KiB, M/MiB,
// G/GiB (case-insensitive): "4MiB", "64M", "1GiB".  Greater than 0.
Result<uint64_t> parseSize(const std::string& text, const std::string& label, uint64_t max = UINT64_MAX);
// 4194304 -> "4MiB"; sizes that are no whole number of KiB stay in bytes.
std::string formatSize(uint64_t bytes);

// An octal file mode, "0660".
Result<uint32_t> parseMode(const std::string& text, const std::string& label);
std::string formatMode(uint32_t mode);

// A CPU number, or -1 for none.
Result<int> parseCpu(const std::string& text, const std::string& label);

// "true" or "false".
Result<bool> parseBool(const std::string& text, const std::string& label);

// One of `choices`.
Status checkChoice(const std::string& value, const std::string& label,
                   const std::vector<std::string_view>& choices);

// HOST:PORT with a numeric port; IPv6 hosts in brackets ("[::1]:7700").
// Port 0 (any free port) only where the daemon listens.
Status checkHostPort(const std::string& value, const std::string& label, bool allow_port0);

// A stream name ([A-Za-z0-9._-], 1-63 characters, fl_stream_name_valid) or,
// with allow_star, "*".
Status checkStreamName(const std::string& name, const std::string& label, bool allow_star);

// "IPv4[:PORT]" (discovery.dns_server) as an address; `default_port` when no
// port is written.  An error when it is not a numeric IPv4 address and a port
// of 1-65535.
Result<sockaddr_in> ipv4WithPort(const std::string& text, uint16_t default_port);

// The data transports framelinkd registers (kTransportNames), in registry order.
const std::vector<std::string_view>& knownTransports();
// A preference list: known transports, none twice, at least one.
Status checkTransports(const std::vector<std::string>& transports, const std::string& label);

// "a, b,c" -> {"a", "b", "c"}.
std::vector<std::string> splitComma(const std::string& text);
std::string join(const std::vector<std::string>& items, const char* separator = ",");

// The shared secret in `path`, without a trailing newline; not empty.
Result<std::string> readTokenFile(const std::string& path, const std::string& label);
// A PEM file for TLS: readable and PEM ("-----BEGIN "); `what` says what it holds.
Result<std::string> readPem(const std::string& path, const std::string& label, const char* what);

}  // namespace framelink
