// json.h: the JSON string escaper every shardlock tool and the torture
// checker write their one-line JSON output with. Not API.
//
// Depends on nothing else of shardlock, so the torture checker can use it and
// still share no code with the lease service it judges.
#pragma once

#include <string>
#include <string_view>

namespace shardlock::tools {

// Appends `text` to `out` as a quoted JSON string: '"' and '\' are escaped
// with a backslash, every control character below 0x20 as \u00XX, and every
// other byte (UTF-8 included) is copied as it is.
void append_json_string(std::string& out, std::string_view text);

// `text` as a quoted JSON string (see append_json_string).
[[nodiscard]] std::string json_string(std::string_view text);

// Whether `text` is valid UTF-8 (no overlong forms, no surrogates, nothing
// above U+10FFFF).
[[nodiscard]] bool valid_utf8(std::string_view text) noexcept;

// How the tools show a key, which is any bytes: valid UTF-8 is kept, every
// other byte is written \xNN (two lowercase hex digits), as is a backslash
// (\x5c), so the result reads back unambiguously. With `controls`, control
// characters (below 0x20, and 0x7f) are written \xNN too: for a terminal.
[[nodiscard]] std::string escaped_key(std::string_view key, bool controls);

// `bytes` as lowercase hex, two digits per byte.
[[nodiscard]] std::string hex_bytes(std::string_view bytes);

}  // namespace shardlock::tools
