// framelinkd's settings as one table: each row is a TOML key, its command-line
// flag, its help text, how its value is written and checked, and the Config
// member it sets.  The TOML reader, the flag parser, --help, describe() and
// the configuration reference's table (--print-config-reference) all walk this
// table, so a setting is added by adding its row to options() in
// config_options.cpp (and its member, with its default, to Config).
//
// Flag names follow the key: `[link] keepalive_ms` is `--keepalive-ms`.  A key
// whose name an earlier section already uses is prefixed with its section:
// `[metrics] listen` is `--metrics-listen`.  Older spellings stay accepted as
// aliases (`--metrics`, `--tls-cert`, `--default-slots`, `--allow-uid`, ...).
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/result.h"
#include "config/config.h"

namespace framelink::config {

// Where a value comes from: the label for messages ("--keepalive-ms" or
// "link.keepalive_ms (line 3 of FILE)") and, for the file, its directory
// (relative file names in the file are relative to it).
struct Origin {
  std::string label;
  bool from_file = false;
  std::string base_dir;  // of the file; empty: the working directory
};

// ---- the kinds of value; each knows its syntax, its checks and how to print it ----

// Free text.  `path`: a file name (relative to the config file in the file).
// `secret`: never printed.  `unset`: what an empty value means, for --help,
// describe() and the configuration reference.
struct Text {
  std::string Config::*field;
  const char* placeholder = "NAME";
  const char* unset = "-";
  bool path = false;
  bool secret = false;
};
struct Choice {
  std::string Config::*field;
  std::vector<std::string_view> choices;
};
// HOST:PORT this daemon listens on (port 0 = any free port).  `optional`:
// empty turns the listener off.
struct Address {
  std::string Config::*field;
  bool optional = false;      // may be set to "" (turned off)
  const char* unset = "off";  // what "" means, as the reference shows it
};
struct Number {
  uint32_t Config::*field;
  uint32_t min = 1;
  uint32_t max = UINT32_MAX;
  const char* placeholder = "N";
};
// A byte count ("4MiB"); 32-bit fields also take counts written with a suffix ("1K").
// `zero`: the word that stands for 0 ("auto"), written and shown as such;
// without one, 0 is refused.
struct Bytes {
  uint64_t Config::*field;
  const char* zero = nullptr;
};
struct Count {
  uint32_t Config::*field;
};
struct Mode {
  uint32_t Config::*field;
};
struct Cpu {
  int Config::*field;
};
struct Switch {
  bool Config::*field;
};
// uid/gid allow-lists: a TOML array of integers, a repeatable (or comma-separated) flag.
struct Ids {
  std::vector<uint32_t> Config::*field;
};
struct Transports {
  std::vector<std::string> Config::*field;
};
// Stream names (fl_stream_name_valid): a TOML array of strings, a repeatable flag.
struct Streams {
  std::vector<std::string> Config::*field;
};
// A `faulty` decorator spec (transport/faulty/faulty_transport.h).
struct FaultSpec {
  std::string Config::*field;
};
// The shared secret read from a file into Config::token; the file name is kept
// in `field` for describe().  link.token and link.token_file exclude each other.
struct TokenFile {
  std::string Config::*field;
};
// [[peer]] tables; on the command line --peer NAME=HOST:PORT and --route
// STREAM=PEER.  Parsed by dedicated code in config.cpp.
struct Peers {};

using Value = std::variant<Text, Choice, Address, Number, Bytes, Count, Mode, Cpu, Switch, Ids, Transports,
                           Streams, FaultSpec, TokenFile, Peers>;

struct Option {
  std::string_view section;  // the TOML table: daemon, link, limits, metrics, peer ([[peer]])
  std::string_view key;
  Value value;
  std::string_view help;
  std::vector<std::string_view> aliases = {};  // older flag spellings, still accepted
  bool in_file = true;                         // false: a command-line flag only
};

// Every setting, in the order of --help, describe() and the configuration reference.
const std::vector<Option>& options();
// The row of [section] key, or nullptr.
const Option* findOption(std::string_view section, std::string_view key);

// Letters to insert, delete or change to turn `a` into `b` (Levenshtein).
size_t editDistance(std::string_view a, std::string_view b);
// Whether a word `distance` away from what the user typed is likely what was
// meant: at most a third of its letters, at least 2.
bool typo(std::string_view typed, size_t distance);

// "--keepalive-ms"; "--metrics-listen" (see the naming rule above).
std::string flagName(const Option& option);
// "link.keepalive_ms"
std::string keyName(const Option& option);
// The flag's value placeholder for --help and the configuration reference: "MS", "HOST:PORT", ...
std::string placeholder(const Option& option);
// Whether the flag takes no value (a switch) or may be repeated (a list).
bool isSwitch(const Option& option);
bool isList(const Option& option);

// Sets the option from the text of a flag (lists: every value given).
Status setFromText(const Option& option, const std::vector<std::string>& values, const Origin& origin,
                   Config& config);
// Sets the option from a TOML value of its file.
Status setFromToml(const Option& option, const toml::node& node, const Origin& origin, Config& config);

// The value as describe() prints it: "4MiB", "0660", "tcp,grpc", "<redacted>",
// or the option's `unset` text.
std::string show(const Option& option, const Config& config);
// The value as a TOML literal ("\"4MiB\"", "8", "[\"tcp\", \"grpc\"]"), or ""
// when it is empty (the option's default is then its `unset` text).
std::string tomlValue(const Option& option, const Config& config);
// The default for --help and the configuration reference: the TOML literal of a default Config,
// or the `unset` text.
std::string defaultText(const Option& option);

}  // namespace framelink::config
