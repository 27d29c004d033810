#include "common/json.h"

namespace shardlock::tools {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

// The length of the valid UTF-8 sequence at text[i], or 0 if there is none.
std::size_t utf8_length(std::string_view text, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80;   // the second byte's range, narrowed to refuse
  unsigned char high = 0xbf;  // overlong forms, surrogates and > U+10FFFF
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return length;
}

void append_hex_escape(std::string& out, unsigned char byte) {
  out += "\\x";
  out += kHexDigits[byte >> 4];
  out += kHexDigits[byte & 0xF];
}

}  // namespace

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20) {
      // \u00XX rather than the short forms (\n, \t, ...): one rule for all
      // 32 control characters, and the spelling the tools always printed.
      out += "\\u00";
      out += kHexDigits[byte >> 4];
      out += kHexDigits[byte & 0xF];
    } else {
      out += c;
    }
  }
  out += '"';
}

std::string json_string(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  append_json_string(out, text);
  return out;
}

bool valid_utf8(std::string_view text) noexcept {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_length(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string escaped_key(std::string_view key, bool controls) {
  std::string out;
  out.reserve(key.size());
  for (std::size_t i = 0; i < key.size();) {
    const auto byte = static_cast<unsigned char>(key[i]);
    const std::size_t length = utf8_length(key, i);
    if (length == 0 || byte == '\\' || (controls && (byte < 0x20 || byte == 0x7f))) {
      append_hex_escape(out, byte);
      ++i;
    } else {
      out.append(key.substr(i, length));
      i += length;
    }
  }
  return out;
}

std::string hex_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(2 * bytes.size());
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    out += kHexDigits[byte >> 4];
    out += kHexDigits[byte & 0xF];
  }
  return out;
}

}  // namespace shardlock::tools
