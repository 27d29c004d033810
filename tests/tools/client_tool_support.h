// Test support for the client tools (shardlockctl_test, shardlock_bench_test):
// a small strict JSON parser to check that what they print is well formed,
// and the names of the child-process runner (tests/support/process.h) that
// runs a tool with captured output and a bounded wait.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/process.h"

namespace shardlock::lease::testing {

// ------------------------------------------------------------------ JSON

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  bool has(const std::string& key) const { return kind == Kind::kObject && fields.count(key) == 1; }
  const Json& operator[](const std::string& key) const {
    static const Json kNullValue;
    const auto it = fields.find(key);
    return it == fields.end() ? kNullValue : it->second;
  }
};

// Parses exactly one JSON value (surrounding whitespace allowed); nullopt if
// `text` is not well-formed JSON.
class JsonParser {
 public:
  static std::optional<Json> parse(std::string_view text) {
    JsonParser p(text);
    Json value;
    if (!p.value(value, 0)) return std::nullopt;
    p.skip_space();
    if (p.at_ != p.text_.size()) return std::nullopt;
    return value;
  }

 private:
  explicit JsonParser(std::string_view text) : text_(text) {}

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t' || text_[at_] == '\r')) {
      ++at_;
    }
  }
  bool literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }
  bool string(std::string& out) {
    if (at_ >= text_.size() || text_[at_] != '"') return false;
    ++at_;
    while (at_ < text_.size()) {
      const char c = text_[at_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) return false;
      const char e = text_[at_++];
      if (e == 'u') {
        if (at_ + 4 > text_.size()) return false;
        for (int i = 0; i < 4; ++i) {
          if (!std::isxdigit(static_cast<unsigned char>(text_[at_ + static_cast<std::size_t>(i)])))
            return false;
        }
        out += '?';
        at_ += 4;
      } else if (std::string_view("\"\\/bfnrt").find(e) != std::string_view::npos) {
        out += e;
      } else {
        return false;
      }
    }
    return false;
  }
  bool number(double& out) {
    const std::size_t begin = at_;
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    const std::size_t digits = at_;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
    if (at_ == digits) return false;
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      const std::size_t fraction = at_;
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      if (at_ == fraction) return false;
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      const std::size_t exponent = at_;
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      if (at_ == exponent) return false;
    }
    out = std::strtod(std::string(text_.substr(begin, at_ - begin)).c_str(), nullptr);
    return true;
  }
  bool value(Json& out, int depth) {
    if (depth > 32) return false;
    skip_space();
    if (at_ >= text_.size()) return false;
    const char c = text_[at_];
    if (c == '{') {
      out.kind = Json::Kind::kObject;
      ++at_;
      skip_space();
      if (at_ < text_.size() && text_[at_] == '}') return ++at_, true;
      for (;;) {
        skip_space();
        std::string key;
        if (!string(key)) return false;
        skip_space();
        if (at_ >= text_.size() || text_[at_++] != ':') return false;
        Json item;
        if (!value(item, depth + 1)) return false;
        if (!out.fields.emplace(key, std::move(item)).second) return false;  // duplicate key
        skip_space();
        if (at_ >= text_.size()) return false;
        if (text_[at_] == ',') {
          ++at_;
          continue;
        }
        return text_[at_++] == '}';
      }
    }
    if (c == '[') {
      out.kind = Json::Kind::kArray;
      ++at_;
      skip_space();
      if (at_ < text_.size() && text_[at_] == ']') return ++at_, true;
      for (;;) {
        Json item;
        if (!value(item, depth + 1)) return false;
        out.items.push_back(std::move(item));
        skip_space();
        if (at_ >= text_.size()) return false;
        if (text_[at_] == ',') {
          ++at_;
          continue;
        }
        return text_[at_++] == ']';
      }
    }
    if (c == '"') {
      out.kind = Json::Kind::kString;
      return string(out.text);
    }
    if (literal("true")) {
      out.kind = Json::Kind::kBool;
      out.boolean = true;
      return true;
    }
    if (literal("false")) {
      out.kind = Json::Kind::kBool;
      return true;
    }
    if (literal("null")) return true;
    out.kind = Json::Kind::kNumber;
    return number(out.number);
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

// ------------------------------------------------------------------ processes

// The tests' one child-process runner (tests/support/process.h).
using ::shardlock::test_support::ChildProcess;
using ::shardlock::test_support::run_tool;
using ::shardlock::test_support::ToolResult;

// The single stdout line of `r` parsed as JSON (trailing newline allowed).
inline std::optional<Json> json_line(const ToolResult& r) {
  std::string text = r.out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.find('\n') != std::string::npos) return std::nullopt;
  return JsonParser::parse(text);
}

}  // namespace shardlock::lease::testing
