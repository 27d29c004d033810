// The tenant model and its file format. See include/shardlock/lease/tenants.h.
#include "shardlock/lease/tenants.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {
namespace {

constexpr std::string_view kRightWords = "acquire, query, admin or all";

bool is_control(char c) noexcept {
  const auto byte = static_cast<unsigned char>(c);
  return byte < 0x20 || byte == 0x7f;
}

bool is_name_byte(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

// " 'word'" for a short printable word, "" otherwise: an error message
// lands in logs, and a word of a tenant file may be a pasted key.
std::string shown(std::string_view word) {
  constexpr std::size_t kMaxShown = 24;
  const bool printable = std::all_of(word.begin(), word.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte >= 0x20 && byte < 0x7f;
  });
  if (word.empty() || word.size() > kMaxShown || !printable) return {};
  return " '" + std::string(word) + "'";
}

std::string byte_hex(char c) {
  std::array<char, 8> text{};
  std::snprintf(text.data(), text.size(), "0x%02x",
                static_cast<unsigned>(static_cast<unsigned char>(c)));
  return text.data();
}

// ---- the checks build() and the parser share -------------------------------

// The tenants accepted so far, indexed for the uniqueness checks. Each
// check answers the cause of a problem, or "" when there is none.
class Registry {
 public:
  std::string check_name(std::string_view name) const {
    if (name.empty() || name.size() > Tenant::kMaxNameLength ||
        !std::all_of(name.begin(), name.end(), is_name_byte)) {
      return "a tenant name is 1 to " + std::to_string(Tenant::kMaxNameLength) +
             " of A-Z a-z 0-9 _ . -, not" +
             (shown(name).empty() ? std::string(" this") : shown(name));
    }
    if (const auto it = names_.find(name); it != names_.end()) {
      return "tenant " + std::string(name) + " is already declared" + where(it->second);
    }
    return {};
  }

  std::string check_key_id(std::uint32_t key_id) const {
    if (const auto it = key_ids_.find(key_id); it != key_ids_.end()) {
      return "key id " + std::to_string(key_id) + " is already tenant " +
             tenants_[it->second].name + "'s" + where(it->second);
    }
    return {};
  }

  // `what` is "key" or "next key"; `other` the tenant's other key, if any.
  std::string check_key(const AuthKey& key, std::string_view what,
                        const std::optional<AuthKey>& other) const {
    if (sodium_is_zero(key.data(), key.size()) == 1) {
      return "the " + std::string(what) + " is all zeros (make one with `shardlockctl keygen`)";
    }
    if (other && *other == key) return "the next key is the same as the current key";
    if (const auto it = keys_.find(key); it != keys_.end()) {
      return "the " + std::string(what) + " is also a key of tenant " + tenants_[it->second].name +
             where(it->second) + ": a key must name one tenant";
    }
    return {};
  }

  static std::string check_rule(const PrefixRule& rule) {
    if (rule.prefix.size() > kMaxKeyLength) {
      return "the prefix is " + std::to_string(rule.prefix.size()) +
             " bytes, longer than any key (" + std::to_string(kMaxKeyLength) +
             "), so it would match nothing";
    }
    if (rule.rights == Rights::kNone || !contains(Rights::kAll, rule.rights)) {
      return std::string("a rule needs rights: ") + std::string(kRightWords);
    }
    if (contains(rule.rights, Rights::kAdmin) && !rule.prefix.empty()) {
      return "admin acts on the whole cell, not on keys, so it is granted on \"\" only "
             "(on a prefix, grant acquire,query)";
    }
    return {};
  }

  // Every check above for a whole tenant.
  std::string check_tenant(const Tenant& tenant) const {
    std::string cause = check_name(tenant.name);
    if (cause.empty()) cause = check_key_id(tenant.key_id);
    if (cause.empty()) cause = check_key(tenant.key, "key", std::nullopt);
    if (cause.empty() && tenant.next_key) {
      cause = check_key(*tenant.next_key, "next key", tenant.key);
    }
    for (const PrefixRule& rule : tenant.rules) {
      if (cause.empty()) cause = check_rule(rule);
    }
    return cause;
  }

  // Adds a checked tenant declared on `line` (0: not from a file).
  void add(Tenant tenant, std::size_t line) {
    const std::size_t index = tenants_.size();
    names_.emplace(tenant.name, index);
    key_ids_.emplace(tenant.key_id, index);
    keys_.emplace(tenant.key, index);
    if (tenant.next_key) keys_.emplace(*tenant.next_key, index);
    tenants_.push_back(std::move(tenant));
    lines_.push_back(line);
  }

  Tenant* find(std::string_view name) {
    const auto it = names_.find(name);
    return it == names_.end() ? nullptr : &tenants_[it->second];
  }

  std::vector<Tenant> release() && { return std::move(tenants_); }

 private:
  std::string where(std::size_t index) const {
    return lines_[index] == 0 ? std::string() : " (line " + std::to_string(lines_[index]) + ")";
  }

  std::vector<Tenant> tenants_;
  std::vector<std::size_t> lines_;
  std::map<std::string, std::size_t, std::less<>> names_;
  std::map<std::uint32_t, std::size_t> key_ids_;
  std::map<AuthKey, std::size_t> keys_;
};

// ---- the parser --------------------------------------------------------------

// One word of a line: bare bytes, optionally followed by one quoted string
// (decoded) that either is the whole word or follows its '='.
struct Word {
  std::string text;
  std::size_t column = 0;  // 1-based, of its first byte
  std::size_t bare = 0;    // bytes of `text` before the quoted part
  bool quoted = false;
};

enum class OptionName : std::uint8_t {
  kId,
  kKey,
  kKeyFile,
  kNext,
  kNextFile,
  kEncrypt,
  kMaxLeases,
  kMaxWaiters,
  kMaxWatches,
};
constexpr std::array<std::string_view, 9> kOptionNames = {
    "id",      "key",        "key-file",    "next",       "next-file",
    "encrypt", "max-leases", "max-waiters", "max-watches"};

// Where each option of one tenant line was written (0: not given).
using OptionColumns = std::array<std::size_t, kOptionNames.size()>;

struct Failure {
  std::size_t column = 0;
  std::string cause;
};

class Parser {
 public:
  Parser(std::string_view base_dir, const KeyFileReader& read_key_file)
      : base_dir_(base_dir), read_key_file_(read_key_file) {}

  // Parses line `number` (without its line end); false with failure() set
  // on an error.
  bool line(std::string_view text, std::size_t number) {
    line_end_column_ = text.size() + 1;
    line_ = number;
    words_.clear();
    if (!split(text)) return false;
    if (words_.empty()) return true;  // blank, or a comment
    const Word& directive = words_.front();
    if (directive.quoted) return fail(directive.column, "a directive is not quoted");
    if (directive.text == "tenant") return tenant_line();
    if (directive.text == "allow") return allow_line();
    return fail(directive.column,
                "unknown directive" + shown(directive.text) + " (expected tenant or allow)");
  }

  const Failure& failure() const noexcept { return failure_; }
  std::vector<Tenant> release() && { return std::move(registry_).release(); }

 private:
  bool fail(std::size_t column, std::string cause) {
    failure_ = {column, std::move(cause)};
    return false;
  }

  bool split(std::string_view text);
  bool quoted_string(std::string_view text, std::size_t& i, Word& word);
  bool escape(std::string_view text, std::size_t& i, Word& word);
  bool tenant_line();
  bool tenant_option(const Word& word, Tenant& tenant, OptionColumns& columns);
  bool number(std::string_view option, std::string_view value, std::size_t column,
              std::uint32_t& out);
  bool key_value(const Word& word, std::size_t value_at, bool from_file, AuthKey& out);
  bool allow_line();
  bool rights(const Word& word, Rights& out, std::size_t& admin_column);

  std::string_view base_dir_;
  const KeyFileReader& read_key_file_;
  Registry registry_;
  std::vector<Word> words_;
  std::size_t line_ = 0;
  std::size_t line_end_column_ = 1;
  Failure failure_;
};

bool Parser::split(std::string_view text) {
  std::size_t i = 0;
  for (;;) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    if (i == text.size() || text[i] == '#') return true;
    Word word;
    word.column = i + 1;
    while (i < text.size() && text[i] != ' ' && text[i] != '\t') {
      const char c = text[i];
      if (c == '"') {
        if (!word.text.empty() && word.text.back() != '=') {
          return fail(i + 1, "a quote may only start a word or follow its '='");
        }
        if (!quoted_string(text, i, word)) return false;
        break;
      }
      if (is_control(c)) {
        return fail(i + 1, "control byte " + byte_hex(c) + " (inside quotes write it as \\x..)");
      }
      word.text.push_back(c);
      ++word.bare;
      ++i;
    }
    words_.push_back(std::move(word));
  }
}

// text[i] is the opening quote; on success i is just past the closing one.
bool Parser::quoted_string(std::string_view text, std::size_t& i, Word& word) {
  const std::size_t open = i++;
  word.quoted = true;
  for (;;) {
    if (i == text.size()) return fail(open + 1, "unterminated quote");
    const char c = text[i];
    if (c == '"') break;
    if (c == '\\') {
      if (!escape(text, i, word)) return false;
      continue;
    }
    if (is_control(c)) {
      return fail(i + 1, "control byte " + byte_hex(c) + " in a quoted string (write it as \\x..)");
    }
    word.text.push_back(c);
    ++i;
  }
  ++i;
  if (i < text.size() && text[i] != ' ' && text[i] != '\t') {
    return fail(i + 1, "expected a space after the closing quote");
  }
  return true;
}

// text[i] is a backslash inside quotes; on success i is past the escape.
bool Parser::escape(std::string_view text, std::size_t& i, Word& word) {
  const std::size_t at = i;
  const std::string_view valid = R"( (escapes are \\ \" \n \r \t \xNN))";
  if (at + 1 == text.size()) {
    return fail(at + 1, std::string("bad escape: '\\' ends the line") + std::string(valid));
  }
  // The one-letter escapes: the letter after the backslash, and its byte.
  static constexpr std::array<std::pair<char, char>, 5> kLetters = {
      {{'\\', '\\'}, {'"', '"'}, {'n', '\n'}, {'r', '\r'}, {'t', '\t'}}};
  const char letter = text[at + 1];
  const auto simple = std::find_if(kLetters.begin(), kLetters.end(),
                                   [letter](const auto& pair) { return pair.first == letter; });
  if (simple != kLetters.end()) {
    word.text.push_back(simple->second);
    i = at + 2;
    return true;
  }
  if (letter != 'x') {
    return fail(at + 1, "bad escape" + shown(text.substr(at, 2)) + std::string(valid));
  }
  unsigned char byte = 0;
  std::size_t decoded = 0;
  const char* end = nullptr;
  const char* digits = text.data() + at + 2;
  if (text.size() - at < 4 || sodium_hex2bin(&byte, 1, digits, 2, nullptr, &decoded, &end) != 0 ||
      decoded != 1 || end != digits + 2) {
    return fail(at + 1, "bad escape: \\x takes two hex digits");
  }
  word.text.push_back(static_cast<char>(byte));
  i = at + 4;
  return true;
}

bool Parser::tenant_line() {
  if (words_.size() < 2) return fail(line_end_column_, "tenant needs a NAME and options");
  const Word& name = words_[1];
  if (name.quoted) return fail(name.column, "a tenant name is not quoted");
  if (std::string cause = registry_.check_name(name.text); !cause.empty()) {
    return fail(name.column, std::move(cause));
  }
  Tenant tenant;
  tenant.name = name.text;
  OptionColumns columns{};
  for (std::size_t w = 2; w < words_.size(); ++w) {
    if (!tenant_option(words_[w], tenant, columns)) return false;
  }
  const auto given = [&columns](OptionName option) {
    return columns[static_cast<std::size_t>(option)] != 0;
  };
  // Where the value of whichever of the two options was given starts.
  const auto value_column = [&columns](OptionName a, OptionName b) {
    const auto at = [&columns](OptionName o) {
      const std::size_t word = columns[static_cast<std::size_t>(o)];
      return word == 0 ? 0 : word + kOptionNames[static_cast<std::size_t>(o)].size() + 1;
    };
    return std::max(at(a), at(b));
  };
  if (!given(OptionName::kId)) {
    return fail(line_end_column_, "tenant " + tenant.name + " has no id=N");
  }
  if (!given(OptionName::kKey) && !given(OptionName::kKeyFile)) {
    return fail(line_end_column_, "tenant " + tenant.name + " has no key= or key-file=");
  }
  if (std::string cause = registry_.check_key(tenant.key, "key", std::nullopt); !cause.empty()) {
    return fail(value_column(OptionName::kKey, OptionName::kKeyFile), std::move(cause));
  }
  if (tenant.next_key) {
    if (std::string cause = registry_.check_key(*tenant.next_key, "next key", tenant.key);
        !cause.empty()) {
      return fail(value_column(OptionName::kNext, OptionName::kNextFile), std::move(cause));
    }
  }
  registry_.add(std::move(tenant), line_);
  return true;
}

bool Parser::tenant_option(const Word& word, Tenant& tenant, OptionColumns& columns) {
  const std::size_t equals = word.text.find('=');
  if (equals == std::string::npos || equals >= word.bare) {
    return fail(word.column,
                "expected OPTION=VALUE, not" +
                    (shown(word.text).empty() ? std::string(" this") : shown(word.text)));
  }
  const std::string_view name = std::string_view(word.text).substr(0, equals);
  const auto found = std::find(kOptionNames.begin(), kOptionNames.end(), name);
  if (found == kOptionNames.end()) return fail(word.column, "unknown option" + shown(name));
  const auto option = static_cast<OptionName>(found - kOptionNames.begin());
  const std::string label = std::string(name) + "=";
  std::size_t& seen = columns[static_cast<std::size_t>(option)];
  if (seen != 0) {
    return fail(word.column, label + " given twice (first at column " + std::to_string(seen) + ")");
  }
  seen = word.column;
  const auto other = [&columns](OptionName o) { return columns[static_cast<std::size_t>(o)]; };
  if ((option == OptionName::kKey && other(OptionName::kKeyFile) != 0) ||
      (option == OptionName::kKeyFile && other(OptionName::kKey) != 0)) {
    return fail(word.column, "key= and key-file= both given; give one");
  }
  if ((option == OptionName::kNext && other(OptionName::kNextFile) != 0) ||
      (option == OptionName::kNextFile && other(OptionName::kNext) != 0)) {
    return fail(word.column, "next= and next-file= both given; give one");
  }
  const std::size_t value_at = equals + 1;
  const std::string_view value = std::string_view(word.text).substr(value_at);
  const std::size_t value_column = word.column + value_at;
  if (value.empty()) return fail(value_column, label + " needs a value");
  switch (option) {
    case OptionName::kId:
      if (!number(label, value, value_column, tenant.key_id)) return false;
      if (std::string cause = registry_.check_key_id(tenant.key_id); !cause.empty()) {
        return fail(value_column, std::move(cause));
      }
      return true;
    case OptionName::kKey:
    case OptionName::kKeyFile:
      return key_value(word, value_at, option == OptionName::kKeyFile, tenant.key);
    case OptionName::kNext:
    case OptionName::kNextFile:
      tenant.next_key.emplace();
      return key_value(word, value_at, option == OptionName::kNextFile, *tenant.next_key);
    case OptionName::kEncrypt:
      if (value != "yes" && value != "no") return fail(value_column, "encrypt= takes yes or no");
      tenant.encrypt = value == "yes";
      return true;
    case OptionName::kMaxLeases:
      return number(label, value, value_column, tenant.limits.max_leases);
    case OptionName::kMaxWaiters:
      return number(label, value, value_column, tenant.limits.max_waiters);
    case OptionName::kMaxWatches:
      return number(label, value, value_column, tenant.limits.max_watches);
  }
  return fail(word.column, "unknown option" + shown(name));
}

bool Parser::number(std::string_view option, std::string_view value, std::size_t column,
                    std::uint32_t& out) {
  const char* end = value.data() + value.size();
  const auto [stop, error] = std::from_chars(value.data(), end, out);
  if (error == std::errc::result_out_of_range) {
    return fail(column, std::string(option) + " is out of range (0 to 4294967295)");
  }
  if (error != std::errc() || stop != end) {
    return fail(column, std::string(option) + " takes a decimal number");
  }
  return true;
}

// The key of a key= / next= word (64 hex digits) or of the file its
// key-file= / next-file= names. Never quotes the value: it may be a key.
bool Parser::key_value(const Word& word, std::size_t value_at, bool from_file, AuthKey& out) {
  const std::string_view value = std::string_view(word.text).substr(value_at);
  const std::string_view option = std::string_view(word.text).substr(0, value_at);
  const std::size_t column = word.column + value_at;
  if (!from_file) {
    const std::optional<AuthKey> key = parse_auth_key(value);
    if (!key) return fail(column, std::string(option) + " takes 64 hex digits (a 32-byte key)");
    out = *key;
    return true;
  }
  std::filesystem::path path(value);
  if (path.is_relative() && !base_dir_.empty()) path = std::filesystem::path(base_dir_) / path;
  const AuthKeyFile file = read_key_file_(path.string());
  if (!file.key) {
    return fail(column, std::string(option) + ": " + file.error);
  }
  out = *file.key;
  return true;
}

bool Parser::allow_line() {
  if (words_.size() < 4) {
    return fail(line_end_column_,
                "allow needs a tenant, a quoted prefix and rights: "
                "allow NAME \"PREFIX\" RIGHTS");
  }
  if (words_.size() > 4) return fail(words_[4].column, "unexpected word after the rights");
  const Word& name = words_[1];
  const Word& prefix = words_[2];
  const Word& list = words_[3];
  Tenant* tenant = name.quoted ? nullptr : registry_.find(name.text);
  if (tenant == nullptr) {
    return fail(name.column,
                "allow for tenant" + shown(name.text) + ", which no tenant line above declares");
  }
  if (!prefix.quoted || prefix.bare != 0) {
    return fail(prefix.column, R"(the prefix is quoted: "PREFIX" ("" for every key))");
  }
  if (list.quoted) {
    return fail(list.column, std::string("rights are not quoted: ") + std::string(kRightWords));
  }
  PrefixRule rule{prefix.text, Rights::kNone};
  std::size_t admin_column = 0;
  if (!rights(list, rule.rights, admin_column)) return false;
  if (std::string cause = Registry::check_rule(rule); !cause.empty()) {
    // The prefix's length is checked first; past it, the only cause left is
    // admin on a prefix, which is the rights word's fault.
    const bool prefix_at_fault = rule.prefix.size() > kMaxKeyLength || admin_column == 0;
    return fail(prefix_at_fault ? prefix.column : admin_column, std::move(cause));
  }
  tenant->rules.push_back(std::move(rule));
  return true;
}

// "acquire,query": each right once. `admin_column` is where admin (or all)
// was written, for the check that it sits on "".
bool Parser::rights(const Word& word, Rights& out, std::size_t& admin_column) {
  struct Spelling {
    std::string_view word;
    Rights rights;
  };
  static constexpr std::array<Spelling, 4> kSpellings = {{{"acquire", Rights::kAcquire},
                                                          {"query", Rights::kQueryWatch},
                                                          {"admin", Rights::kAdmin},
                                                          {"all", Rights::kAll}}};
  const std::string_view text = word.text;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view part = text.substr(start, comma - start);
    const std::size_t column = word.column + start;
    if (part.empty()) {
      return fail(column, "empty right in the list (" + std::string(kRightWords) + ")");
    }
    const auto spelling = std::find_if(kSpellings.begin(), kSpellings.end(),
                                       [part](const Spelling& s) { return s.word == part; });
    if (spelling == kSpellings.end()) {
      return fail(column, "unknown right" + shown(part) + " (" + std::string(kRightWords) + ")");
    }
    if ((out & spelling->rights) != Rights::kNone) {
      return fail(column, "'" + std::string(part) + "' repeats a right listed before it");
    }
    out |= spelling->rights;
    if (contains(spelling->rights, Rights::kAdmin)) admin_column = column;
    if (comma == text.size()) return true;
    start = comma + 1;
  }
}

}  // namespace

std::string to_string(Rights rights) {
  std::string text;
  for (const auto& [bit, word] :
       {std::pair{Rights::kAcquire, "acquire"}, std::pair{Rights::kQueryWatch, "query"},
        std::pair{Rights::kAdmin, "admin"}}) {
    if (!contains(rights, bit)) continue;
    if (!text.empty()) text += ',';
    text += word;
  }
  return text.empty() ? "none" : text;
}

TenantTable::TenantTable(std::vector<Tenant> tenants) : tenants_(std::move(tenants)) {
  std::sort(tenants_.begin(), tenants_.end(),
            [](const Tenant& a, const Tenant& b) { return a.key_id < b.key_id; });
  key_ids_.reserve(tenants_.size());
  by_name_.reserve(tenants_.size());
  for (Tenant& tenant : tenants_) {
    // One rule per prefix: the union of every rule written for it.
    std::vector<PrefixRule>& rules = tenant.rules;
    std::sort(rules.begin(), rules.end(),
              [](const PrefixRule& a, const PrefixRule& b) { return a.prefix < b.prefix; });
    std::vector<PrefixRule> merged;
    for (PrefixRule& rule : rules) {
      if (!merged.empty() && merged.back().prefix == rule.prefix) {
        merged.back().rights |= rule.rights;
      } else {
        merged.push_back(std::move(rule));
      }
    }
    rules = std::move(merged);
    by_name_.push_back(static_cast<std::uint32_t>(key_ids_.size()));
    key_ids_.push_back(tenant.key_id);
  }
  std::sort(by_name_.begin(), by_name_.end(), [this](std::uint32_t a, std::uint32_t b) {
    return tenants_[a].name < tenants_[b].name;
  });
}

TenantTable TenantTable::single(const AuthKey& key) {
  Tenant tenant;
  tenant.name = "default";
  tenant.key_id = 0;
  tenant.key = key;
  tenant.rules.push_back({"", Rights::kAll});
  std::vector<Tenant> tenants;
  tenants.push_back(std::move(tenant));
  return TenantTable(std::move(tenants));
}

TenantTableResult TenantTable::build(std::vector<Tenant> tenants) {
  TenantTableResult result;
  Registry registry;
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    if (std::string cause = registry.check_tenant(tenants[i]); !cause.empty()) {
      result.error = "tenants[" + std::to_string(i) + "]" + shown(tenants[i].name) + ": " + cause;
      return result;
    }
    registry.add(std::move(tenants[i]), 0);
  }
  result.table = TenantTable(std::move(registry).release());
  return result;
}

const Tenant* TenantTable::find(std::uint32_t key_id) const noexcept {
  const auto it = std::lower_bound(key_ids_.begin(), key_ids_.end(), key_id);
  if (it == key_ids_.end() || *it != key_id) return nullptr;
  return &tenants_[static_cast<std::size_t>(it - key_ids_.begin())];
}

const Tenant* TenantTable::find_by_name(std::string_view name) const noexcept {
  const auto it = std::lower_bound(
      by_name_.begin(), by_name_.end(), name,
      [this](std::uint32_t index, std::string_view n) { return tenants_[index].name < n; });
  if (it == by_name_.end() || tenants_[*it].name != name) return nullptr;
  return &tenants_[*it];
}

std::string TenantTableResult::message() const {
  const std::string line_text = std::to_string(line);
  const std::string column_text = std::to_string(column);
  if (!file.empty() && line != 0) return file + ":" + line_text + ":" + column_text + ": " + error;
  if (!file.empty()) return file + ": " + error;
  if (line != 0) return "line " + line_text + ", column " + column_text + ": " + error;
  return error;
}

TenantTableResult parse_tenant_file(std::string_view text, std::string_view base_dir,
                                    const KeyFileReader& read_key_file) {
  TenantTableResult result;
  Parser parser(base_dir, read_key_file);
  std::size_t number = 0;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (line.ends_with('\r')) line.remove_suffix(1);
    ++number;
    if (!parser.line(line, number)) {
      result.line = number;
      result.column = parser.failure().column;
      result.error = parser.failure().cause;
      return result;
    }
  }
  std::vector<Tenant> tenants = std::move(parser).release();
  if (tenants.empty()) {
    result.error = "the file declares no tenant (a server with none would refuse every client)";
    return result;
  }
  return TenantTable::build(std::move(tenants));
}

TenantTableResult load_tenant_file(const std::string& path) {
  TenantTableResult result;
  result.file = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    result.error = std::string("cannot read the tenant file: ") + std::strerror(errno);
    return result;
  }
  std::string text;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    result.error = "cannot read the tenant file: it is a directory";
  }
  // Read one byte past the limit, to tell a file of exactly the limit from
  // a larger one.
  constexpr std::size_t kChunk = std::size_t{64} << 10;
  while (result.error.empty()) {
    const std::size_t have = text.size();
    text.resize(std::min(have + kChunk, kMaxTenantFileSize + 1));
    const ssize_t got = ::read(fd, text.data() + have, text.size() - have);
    text.resize(have + static_cast<std::size_t>(std::max<ssize_t>(got, 0)));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      result.error = std::string("cannot read the tenant file: ") + std::strerror(errno);
    } else if (text.size() > kMaxTenantFileSize) {
      result.error =
          "the tenant file is larger than " + std::to_string(kMaxTenantFileSize >> 20) + " MiB";
    } else if (got == 0) {
      break;
    }
  }
  ::close(fd);
  if (!result.error.empty()) return result;
  TenantTableResult parsed =
      parse_tenant_file(text, std::filesystem::path(path).parent_path().string());
  parsed.file = path;
  return parsed;
}

}  // namespace shardlock::lease
