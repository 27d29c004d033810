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

}  // namespace shardlock::tools
