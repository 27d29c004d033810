#include "shardlock/lease/tenants.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace shardlock::lease {

// Outside the unnamed namespace, where argument-dependent lookup finds them.
void PrintTo(Rights rights, std::ostream* out) { *out << to_string(rights); }
void PrintTo(const PrefixRule& rule, std::ostream* out) {
  *out << "{\"" << rule.prefix << "\", " << to_string(rule.rights) << "}";
}

namespace {

using namespace std::string_literals;

AuthKey key_of(std::uint8_t fill) {
  AuthKey key;
  key.fill(fill);
  return key;
}
std::string hex_of(std::uint8_t fill) { return format_auth_key(key_of(fill)); }

// Key files without a disk: path -> key; every path asked for is recorded.
struct FakeKeyFiles {
  std::map<std::string, AuthKey> files;
  std::vector<std::string> asked;

  KeyFileReader reader() {
    return [this](const std::string& path) {
      asked.push_back(path);
      AuthKeyFile result;
      if (const auto it = files.find(path); it != files.end()) {
        result.key = it->second;
      } else {
        result.error = "cannot read key file " + path + ": No such file or directory";
      }
      return result;
    };
  }
};

// One key file, "a.key", holding key_of(7).
TenantTableResult parse(std::string_view text) {
  FakeKeyFiles disk;
  disk.files["a.key"] = key_of(7);
  return parse_tenant_file(text, "", disk.reader());
}

TEST(TenantFile, ParsesEveryOption) {
  FakeKeyFiles disk;
  disk.files["/etc/sl/billing.key"] = key_of(1);
  disk.files["/etc/sl/billing.next"] = key_of(2);
  disk.files["/abs/ops.key"] = key_of(3);
  const std::string text =
      "# billing may lock and watch its own keys; ops may do anything anywhere.\n"
      "tenant billing id=1 key-file=billing.key next-file=billing.next encrypt=yes "
      "max-leases=5000 max-waiters=7 max-watches=4294967295\n"
      "\ttenant  ops\tid=4294967295 key-file=/abs/ops.key   # trailing comment\n"
      "tenant plain id=0 key=" +
      hex_of(4) + " next=" + hex_of(5) +
      " encrypt=no\n"
      "\n"
      "allow billing \"billing/\" acquire,query\n"
      "allow billing \"shared/\\xff\" query\n"
      "allow ops \"\" all\n";
  const TenantTableResult result = parse_tenant_file(text, "/etc/sl", disk.reader());
  ASSERT_TRUE(result.ok()) << result.message();
  const TenantTable& table = *result.table;
  ASSERT_EQ(table.size(), 3U);
  EXPECT_EQ(disk.asked, (std::vector<std::string>{"/etc/sl/billing.key", "/etc/sl/billing.next",
                                                  "/abs/ops.key"}));

  const Tenant* billing = table.find(1);
  ASSERT_NE(billing, nullptr);
  EXPECT_EQ(billing->name, "billing");
  EXPECT_EQ(billing->key, key_of(1));
  EXPECT_EQ(billing->next_key, key_of(2));
  EXPECT_TRUE(billing->encrypt);
  EXPECT_EQ(billing->limits, (TenantLimits{5000, 7, 4294967295U}));
  EXPECT_EQ(billing->rules,
            (std::vector<PrefixRule>{{"billing/", Rights::kAcquire | Rights::kQueryWatch},
                                     {"shared/\xff", Rights::kQueryWatch}}));

  const Tenant* ops = table.find(4294967295U);
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->name, "ops");
  EXPECT_FALSE(ops->next_key.has_value());
  EXPECT_FALSE(ops->encrypt);
  EXPECT_EQ(ops->limits, TenantLimits{});
  EXPECT_EQ(ops->rules, (std::vector<PrefixRule>{{"", Rights::kAll}}));

  const Tenant* plain = table.find(0);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->key, key_of(4));
  EXPECT_EQ(plain->next_key, key_of(5));
  EXPECT_TRUE(plain->rules.empty());
  EXPECT_EQ(rights_for(*plain, "anything"), Rights::kNone);
}

TEST(TenantFile, KeyFilePathsAreRelativeToTheBaseDirectory) {
  FakeKeyFiles disk;
  disk.files["dir/a.key"] = key_of(1);
  disk.files["b.key"] = key_of(2);
  disk.files["/x/c d.key"] = key_of(3);
  EXPECT_TRUE(parse_tenant_file("tenant a id=1 key-file=a.key", "dir", disk.reader()).ok());
  EXPECT_TRUE(parse_tenant_file("tenant b id=1 key-file=b.key", "", disk.reader()).ok());
  // A quoted value may hold spaces; an absolute path ignores the base.
  EXPECT_TRUE(
      parse_tenant_file("tenant c id=1 key-file=\"/x/c d.key\"", "dir", disk.reader()).ok());
  EXPECT_EQ(disk.asked, (std::vector<std::string>{"dir/a.key", "b.key", "/x/c d.key"}));
}

TEST(TenantFile, CommentsStartOnlyWhereAWordMay) {
  FakeKeyFiles disk;
  disk.files["a#b.key"] = key_of(1);
  const TenantTableResult result = parse_tenant_file(
      "  # a comment\n"
      "tenant a id=1 key-file=a#b.key #comment \"unterminated\n"
      "allow a \"x#y\" acquire#not-a-comment\n",
      "", disk.reader());
  // "acquire#not-a-comment" is not a right: the '#' was inside a word.
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.line, 3U);
  EXPECT_EQ(result.column, 15U);

  const TenantTableResult fixed = parse_tenant_file(
      "tenant a id=1 key-file=a#b.key #comment \"unterminated\n"
      "allow a \"x#y\" acquire # a comment\n",
      "", disk.reader());
  ASSERT_TRUE(fixed.ok()) << fixed.message();
  EXPECT_EQ(fixed.table->find(1)->rules, (std::vector<PrefixRule>{{"x#y", Rights::kAcquire}}));
}

TEST(TenantFile, DecodesEscapes) {
  const TenantTableResult result = parse("tenant a id=1 key=" + hex_of(1) +
                                         "\n"
                                         R"(allow a "q\"b\\s\n\r\t\x00\xFF\x7f end" acquire)");
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.table->find(1)->rules.at(0).prefix, "q\"b\\s\n\r\t\x00\xff\x7f end"s);
}

TEST(TenantFile, ReadsCrlfAndMissingFinalNewline) {
  const std::string text = "tenant a id=1 key=" + hex_of(1) + "\r\nallow a \"\" all\r\n" +
                           "tenant b id=2 key=" + hex_of(2);
  const TenantTableResult result = parse(text);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.table->size(), 2U);

  const TenantTableResult bad = parse("tenant a id=1 key=" + hex_of(1) + "\r\nallow a x all\r\n");
  EXPECT_EQ(bad.line, 2U);
  EXPECT_EQ(bad.column, 9U);
}

struct BadLine {
  std::string text;
  std::size_t line;
  std::size_t column;
  std::string cause;  // a part of the error
};

// Every class of malformed line: the first error, where it is, and why.
TEST(TenantFile, EveryMalformedLineNamesItsLineAndColumn) {
  const std::string k1 = hex_of(1);
  const std::string k2 = hex_of(2);
  const std::string a = "tenant a id=1 key=" + k1 + "\n";  // 83 bytes, then line 2
  const std::vector<BadLine> cases = {
      {"tenat a id=1 key=" + k1, 1, 1, "unknown directive 'tenat'"},
      {"\"tenant\" a", 1, 1, "a directive is not quoted"},
      {"tenant", 1, 7, "tenant needs a NAME"},
      {"tenant   ", 1, 10, "tenant needs a NAME"},
      {"tenant a/b id=1 key=" + k1, 1, 8, "a tenant name is 1 to 64"},
      {"tenant " + std::string(65, 'n') + " id=1 key=" + k1, 1, 8, "a tenant name is 1 to 64"},
      {"tenant \"a\" id=1 key=" + k1, 1, 8, "not quoted"},
      {a + "tenant a id=2 key=" + k2, 2, 8, "tenant a is already declared (line 1)"},
      {a + "tenant b id=1 key=" + k2, 2, 13, "key id 1 is already tenant a's (line 1)"},
      {"tenant a key=" + k1, 1, 78, "has no id=N"},
      {"tenant a id=1", 1, 14, "has no key= or key-file="},
      {"tenant a id=1 next=" + k1, 1, 84, "has no key= or key-file="},
      {"tenant a id=1 key=" + k1.substr(0, 63) + "g", 1, 19, "key= takes 64 hex digits"},
      {"tenant a id=1 key=" + k1.substr(0, 62), 1, 19, "key= takes 64 hex digits"},
      {"tenant a id=1 key=" + k1 + "00", 1, 19, "key= takes 64 hex digits"},
      {"tenant a id=1 key=" + k1 + " next=xyz", 1, 89, "next= takes 64 hex digits"},
      {"tenant a id=1 key-file=/nope", 1, 24, "key-file=: cannot read key file /nope"},
      {"tenant a id=1 key=" + k1 + " next-file=rel", 1, 94, "next-file=: cannot read key file rel"},
      {"tenant a id=1 key=" + hex_of(0), 1, 19, "all zeros"},
      {a + "tenant b id=2 key=" + k1, 2, 19, "also a key of tenant a (line 1)"},
      {a + "tenant b id=2 key=" + k2 + " next=" + k1, 2, 89, "also a key of tenant a (line 1)"},
      {"tenant a id=1 key=" + k1 + " next=" + k1, 1, 89, "next key is the same as the current"},
      {"tenant a id=1 key=" + k1 + " colour=red", 1, 84, "unknown option 'colour'"},
      {"tenant a id=1 key=" + k1 + " encrypt", 1, 84, "expected OPTION=VALUE, not 'encrypt'"},
      {"tenant a id=1 key=" + k1 + " =5", 1, 84, "unknown option"},
      {"tenant a id=1 id=2 key=" + k1, 1, 15, "id= given twice (first at column 10)"},
      {"tenant a id=1 key=" + k1 + " encrypt=yes encrypt=no", 1, 96, "encrypt= given twice"},
      {"tenant a id=1 key=" + k1 + " key-file=a", 1, 84, "key= and key-file= both given"},
      {"tenant a id=1 key-file=a.key key=" + k1, 1, 30, "key= and key-file= both given"},
      {"tenant a id=1 key=" + k1 + " next=" + k2 + " next-file=x", 1, 154,
       "next= and next-file= both given"},
      {"tenant a id= key=" + k1, 1, 13, "id= needs a value"},
      {"tenant a id=\"\" key=" + k1, 1, 13, "id= needs a value"},
      {"tenant a id=4294967296 key=" + k1, 1, 13, "id= is out of range (0 to 4294967295)"},
      {"tenant a id=1 key=" + k1 + " max-leases=99999999999999999999999", 1, 95,
       "max-leases= is out of range"},
      {"tenant a id=1 key=" + k1 + " max-waiters=-1", 1, 96, "max-waiters= takes a decimal"},
      {"tenant a id=1 key=" + k1 + " max-watches=1k", 1, 96, "max-watches= takes a decimal"},
      {"tenant a id=+1 key=" + k1, 1, 13, "id= takes a decimal number"},
      {"tenant a id=0x10 key=" + k1, 1, 13, "id= takes a decimal number"},
      {"tenant a id=1 key=" + k1 + " encrypt=true", 1, 92, "encrypt= takes yes or no"},
      {"allow a \"\" all", 1, 7, "which no tenant line above declares"},
      {"allow a \"\" all\n" + a, 1, 7, "which no tenant line above declares"},
      {a + "allow", 2, 6, "allow needs a tenant, a quoted prefix and rights"},
      {a + "allow a \"x\"", 2, 12, "allow needs a tenant, a quoted prefix and rights"},
      {a + "allow a \"x\" acquire query", 2, 21, "unexpected word after the rights"},
      {a + "allow a x acquire", 2, 9, "the prefix is quoted"},
      {a + "allow a x\"y\" acquire", 2, 10, "a quote may only start a word or follow its '='"},
      {a + "allow a \"x\"y acquire", 2, 12, "expected a space after the closing quote"},
      {a + "allow a \"x acquire", 2, 9, "unterminated quote"},
      {a + "allow a \"x\\q\" acquire", 2, 11, "bad escape '\\q'"},
      {a + "allow a \"x\\x4\" acquire", 2, 11, "\\x takes two hex digits"},
      {a + "allow a \"x\\xg0\" acquire", 2, 11, "\\x takes two hex digits"},
      {a + "allow a \"x\\x4", 2, 11, "\\x takes two hex digits"},
      {a + "allow a \"x\\", 2, 11, "'\\' ends the line"},
      {a + "allow a \"x\ty\" acquire", 2, 11, "control byte 0x09 in a quoted string"},
      {a + "allow a \"x\" acq\x01uire", 2, 16, "control byte 0x01"},
      {a + "allow a \"x\" acquire\r\r", 2, 20, "control byte 0x0d"},
      {a + "allow a \"x\" \"acquire\"", 2, 13, "rights are not quoted"},
      {a + "allow a \"x\" acquire,lock", 2, 21, "unknown right 'lock'"},
      {a + "allow a \"x\" acquire,,query", 2, 21, "empty right in the list"},
      {a + "allow a \"x\" acquire,", 2, 21, "empty right in the list"},
      {a + "allow a \"x\" query,acquire,query", 2, 27, "'query' repeats a right"},
      {a + "allow a \"\" all,admin", 2, 16, "'admin' repeats a right"},
      {a + "allow a \"x\" acquire,admin", 2, 21, "granted on \"\" only"},
      {a + "allow a \"x\" all", 2, 13, "granted on \"\" only"},
      {a + "allow a \"" + std::string(kMaxKeyLength + 1, 'p') + "\" acquire", 2, 9,
       "longer than any key"},
      {a + "# fine\n\n   \ntenant b id=2 key=" + k2 + " bogus=1", 5, 84, "unknown option"},
  };
  for (const BadLine& bad : cases) {
    const TenantTableResult result = parse(bad.text);
    EXPECT_FALSE(result.ok()) << bad.text;
    EXPECT_FALSE(result.table.has_value()) << bad.text;
    EXPECT_EQ(result.line, bad.line) << bad.text << "\n" << result.message();
    EXPECT_EQ(result.column, bad.column) << bad.text << "\n" << result.message();
    EXPECT_NE(result.error.find(bad.cause), std::string::npos)
        << bad.text << "\nwanted: " << bad.cause << "\ngot:    " << result.message();
  }
}

TEST(TenantFile, AFileWithoutTenantsIsAnError) {
  for (const char* text : {"", "\n", "# only a comment\n", "   \t\n\n"}) {
    const TenantTableResult result = parse(text);
    EXPECT_FALSE(result.ok()) << text;
    EXPECT_EQ(result.line, 0U);
    EXPECT_NE(result.error.find("declares no tenant"), std::string::npos) << result.error;
  }
}

TEST(TenantFile, ErrorsNeverQuoteAKey) {
  const std::string secret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeZ";
  for (const std::string& text : {"tenant a id=1 key=" + secret, secret, "tenant a id=1 " + secret,
                                  "tenant a id=1 key=" + hex_of(1) + " k" + secret + "=1"}) {
    const TenantTableResult result = parse(text);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.message().find(secret.substr(0, 16)), std::string::npos) << result.message();
  }
}

TEST(TenantFile, EveryTruncationParsesOrFailsAtAPlaceInTheText) {
  const std::string text = "tenant a id=1 key=" + hex_of(1) + " next=" + hex_of(2) +
                           " encrypt=yes max-leases=10\n"
                           "allow a \"x\\x41\\\"\" acquire,query # c\n"
                           "tenant b id=2 key=" +
                           hex_of(3) + "\nallow b \"\" all\n";
  ASSERT_TRUE(parse(text).ok());
  for (std::size_t n = 0; n <= text.size(); ++n) {
    const std::string cut = text.substr(0, n);
    const TenantTableResult result = parse(cut);
    if (result.ok()) continue;
    if (result.line == 0) continue;  // no tenant yet
    // The line exists and the column is in it or just past its end.
    std::size_t start = 0;
    for (std::size_t line = 1; line < result.line; ++line) start = cut.find('\n', start) + 1;
    const std::size_t length = std::min(cut.find('\n', start), cut.size()) - start;
    EXPECT_GE(result.column, 1U) << cut;
    EXPECT_LE(result.column, length + 1) << cut << "\n" << result.message();
  }
}

TEST(TenantFile, MessagesNameTheFileLineAndColumn) {
  TenantTableResult result = parse("tenant a id=x key=" + hex_of(1));
  EXPECT_EQ(result.message(), "line 1, column 13: id= takes a decimal number");
  result.file = "/etc/tenants";
  EXPECT_EQ(result.message(), "/etc/tenants:1:13: id= takes a decimal number");
  result.line = 0;
  EXPECT_EQ(result.message(), "/etc/tenants: id= takes a decimal number");
  result.file.clear();
  EXPECT_EQ(result.message(), "id= takes a decimal number");
}

// ---- prefix matching ----

TEST(TenantRights, PrefixesMatchBytewise) {
  const TenantTableResult result = parse("tenant t id=7 key=" + hex_of(1) +
                                         "\n"
                                         "allow t \"orders/\" acquire\n"
                                         "allow t \"orders/eu/\" query\n"
                                         "allow t \"\\xff\\x00k\" acquire\n"
                                         "allow t \"caf\\xc3\\xa9\" query\n");
  ASSERT_TRUE(result.ok()) << result.message();
  const Tenant& t = *result.table->find(7);
  const Rights both = Rights::kAcquire | Rights::kQueryWatch;

  EXPECT_EQ(rights_for(t, "orders/"), Rights::kAcquire);  // equal to the prefix
  EXPECT_EQ(rights_for(t, "orders/1"), Rights::kAcquire);
  EXPECT_EQ(rights_for(t, "orders/eu/9"), both);  // overlapping: the union
  EXPECT_EQ(rights_for(t, "orders/eu/"), both);
  EXPECT_EQ(rights_for(t, "orders/eu"), Rights::kAcquire);  // shorter than "orders/eu/"
  EXPECT_EQ(rights_for(t, "orders"), Rights::kNone);        // shorter than "orders/"
  EXPECT_EQ(rights_for(t, "Orders/1"), Rights::kNone);      // bytes, not case-folded
  EXPECT_EQ(rights_for(t, "x/orders/1"), Rights::kNone);    // a prefix, not a substring
  EXPECT_EQ(rights_for(t, ""), Rights::kNone);
  EXPECT_EQ(rights_for(t, "\xff\x00k"s), Rights::kAcquire);  // not UTF-8, with a NUL
  EXPECT_EQ(rights_for(t, "\xff\x00kz\x80"s), Rights::kAcquire);
  EXPECT_EQ(rights_for(t, "\xff\x00"s), Rights::kNone);
  EXPECT_EQ(rights_for(t, "\xff"s), Rights::kNone);  // "\xff" then NUL, not C strings
  EXPECT_EQ(rights_for(t, "\xfe\x00k"s), Rights::kNone);
  EXPECT_EQ(rights_for(t, "caf\xc3\xa9/menu"), Rights::kQueryWatch);
  EXPECT_EQ(rights_for(t, "cafe/menu"), Rights::kNone);
}

TEST(TenantRights, EmptyPrefixMatchesEveryKey) {
  const TenantTableResult result =
      parse("tenant t id=1 key=" + hex_of(1) + "\nallow t \"\" acquire\nallow t \"a\" query\n");
  ASSERT_TRUE(result.ok()) << result.message();
  const Tenant& t = *result.table->find(1);
  EXPECT_EQ(rights_for(t, ""), Rights::kAcquire);
  EXPECT_EQ(rights_for(t, "\x00"s), Rights::kAcquire);
  EXPECT_EQ(rights_for(t, "zzz"), Rights::kAcquire);
  EXPECT_EQ(rights_for(t, "abc"), Rights::kAcquire | Rights::kQueryWatch);
  EXPECT_EQ(rights_for(t, std::string(kMaxKeyLength, 'q')), Rights::kAcquire);
}

TEST(TenantRights, RulesOfOnePrefixMergeIntoOne) {
  const TenantTableResult result = parse("tenant t id=1 key=" + hex_of(1) +
                                         "\nallow t \"b\" query\n"
                                         "allow t \"a\" acquire\n"
                                         "allow t \"b\" acquire\n"
                                         "allow t \"b\" query\n");
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.table->find(1)->rules,
            (std::vector<PrefixRule>{{"a", Rights::kAcquire},
                                     {"b", Rights::kAcquire | Rights::kQueryWatch}}));
}

TEST(TenantRights, NamesAndBitOperations) {
  EXPECT_EQ(to_string(Rights::kNone), "none");
  EXPECT_EQ(to_string(Rights::kAll), "acquire,query,admin");
  EXPECT_EQ(to_string(Rights::kAdmin | Rights::kAcquire), "acquire,admin");
  EXPECT_EQ(to_string(Rights::kQueryWatch), "query");
  EXPECT_TRUE(contains(Rights::kAll, Rights::kAdmin));
  EXPECT_TRUE(contains(Rights::kAcquire, Rights::kNone));
  EXPECT_FALSE(contains(Rights::kAcquire, Rights::kAcquire | Rights::kQueryWatch));
  Rights r = Rights::kNone;
  r |= Rights::kQueryWatch;
  EXPECT_EQ(r & Rights::kQueryWatch, Rights::kQueryWatch);
  EXPECT_EQ(r & Rights::kAcquire, Rights::kNone);
}

// ---- the table ----

TEST(TenantTable, FindsByKeyIdAndName) {
  const TenantTableResult result =
      parse("tenant z id=30 key=" + hex_of(1) + "\ntenant m id=10 key=" + hex_of(2) +
            "\ntenant a id=20 key=" + hex_of(3) + "\n");
  ASSERT_TRUE(result.ok()) << result.message();
  const TenantTable& table = *result.table;
  ASSERT_EQ(table.size(), 3U);
  EXPECT_FALSE(table.empty());
  EXPECT_EQ(table.find(10)->name, "m");
  EXPECT_EQ(table.find(20)->name, "a");
  EXPECT_EQ(table.find(30)->name, "z");
  for (const std::uint32_t missing : {0U, 9U, 11U, 25U, 31U, 4294967295U}) {
    EXPECT_EQ(table.find(missing), nullptr) << missing;
  }
  EXPECT_EQ(table.find_by_name("z"), table.find(30));
  EXPECT_EQ(table.find_by_name("a"), table.find(20));
  EXPECT_EQ(table.find_by_name("m"), table.find(10));
  EXPECT_EQ(table.find_by_name("b"), nullptr);
  EXPECT_EQ(table.find_by_name(""), nullptr);
  // tenants() is sorted by key id.
  ASSERT_EQ(table.tenants().size(), 3U);
  EXPECT_EQ(table.tenants()[0].key_id, 10U);
  EXPECT_EQ(table.tenants()[2].key_id, 30U);

  const TenantTable none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.find(0), nullptr);
  EXPECT_EQ(none.find_by_name("default"), nullptr);
}

TEST(TenantTable, SingleIsTheLegacyKeyWithEveryRight) {
  const TenantTable table = TenantTable::single(key_of(9));
  ASSERT_EQ(table.size(), 1U);
  const Tenant* tenant = table.find(0);
  ASSERT_NE(tenant, nullptr);
  EXPECT_EQ(tenant->name, "default");
  EXPECT_EQ(tenant->key, key_of(9));
  EXPECT_FALSE(tenant->next_key.has_value());
  EXPECT_FALSE(tenant->encrypt);
  EXPECT_EQ(tenant->limits, TenantLimits{});
  EXPECT_EQ(table.find_by_name("default"), tenant);
  for (const std::string& key : {""s, "a"s, "orders/7"s, "\xff\x00"s, std::string(256, 'k')}) {
    EXPECT_EQ(rights_for(*tenant, key), Rights::kAll);
  }
  EXPECT_EQ(table.find(1), nullptr);
}

TEST(TenantTable, BuildChecksWhatTheParserChecks) {
  Tenant a;
  a.name = "a";
  a.key_id = 5;
  a.key = key_of(1);
  a.rules = {{"x/", Rights::kQueryWatch}, {"", Rights::kAdmin}, {"x/", Rights::kAcquire}};
  Tenant b = a;
  b.name = "b";
  b.key = key_of(2);

  TenantTableResult result = TenantTable::build({a, b});
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.line, 0U);
  EXPECT_EQ(result.error, "tenants[1] 'b': key id 5 is already tenant a's");

  b.key_id = 6;
  result = TenantTable::build({a, b});
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.table->find(6)->rules,
            (std::vector<PrefixRule>{{"", Rights::kAdmin},
                                     {"x/", Rights::kAcquire | Rights::kQueryWatch}}));

  const auto refused = [&](Tenant bad, std::string_view cause) {
    const TenantTableResult r = TenantTable::build({a, std::move(bad)});
    EXPECT_FALSE(r.ok()) << cause;
    EXPECT_NE(r.error.find(cause), std::string::npos) << r.error;
  };
  Tenant bad = b;
  bad.name = "b c";
  refused(bad, "a tenant name is 1 to 64");
  bad = b;
  bad.name = "a";
  refused(bad, "tenant a is already declared");
  bad = b;
  bad.key = key_of(1);
  refused(bad, "also a key of tenant a");
  bad = b;
  bad.next_key = key_of(2);
  refused(bad, "the next key is the same as the current key");
  bad = b;
  bad.key = key_of(0);
  refused(bad, "all zeros");
  bad = b;
  bad.rules = {{"x", Rights::kNone}};
  refused(bad, "a rule needs rights");
  bad = b;
  bad.rules = {{"x", static_cast<Rights>(0x80)}};
  refused(bad, "a rule needs rights");
  bad = b;
  bad.rules = {{"x", Rights::kAdmin}};
  refused(bad, "granted on \"\" only");
  bad = b;
  bad.rules = {{std::string(kMaxKeyLength + 1, 'x'), Rights::kAcquire}};
  refused(bad, "longer than any key");
}

TEST(TenantTable, AThousandTenantFileParses) {
  constexpr std::uint32_t kTenants = 1000;
  std::string text;
  for (std::uint32_t i = 0; i < kTenants; ++i) {
    AuthKey key{};
    key[0] = static_cast<std::uint8_t>(i & 0xff);
    key[1] = static_cast<std::uint8_t>(i >> 8);
    key[2] = 1;
    AuthKey next = key;
    next[3] = 1;
    const std::string name = "tenant-" + std::to_string(i);
    text += "tenant " + name + " id=" + std::to_string(i * 7919U + 3) +
            " key=" + format_auth_key(key) + " next=" + format_auth_key(next) +
            " max-leases=" + std::to_string(i) + "\n";
    text += "allow " + name + " \"" + name + "/\" acquire,query\n";
    text += "allow " + name + " \"shared/\" query\n";
  }
  const TenantTableResult result = parse(text);
  ASSERT_TRUE(result.ok()) << result.message();
  const TenantTable& table = *result.table;
  ASSERT_EQ(table.size(), kTenants);
  for (std::uint32_t i = 0; i < kTenants; ++i) {
    const Tenant* tenant = table.find(i * 7919U + 3);
    ASSERT_NE(tenant, nullptr) << i;
    const std::string name = "tenant-" + std::to_string(i);
    EXPECT_EQ(tenant->name, name);
    EXPECT_EQ(table.find_by_name(name), tenant);
    EXPECT_EQ(tenant->limits.max_leases, i);
    EXPECT_EQ(rights_for(*tenant, name + "/job"), Rights::kAcquire | Rights::kQueryWatch);
    EXPECT_EQ(rights_for(*tenant, "shared/x"), Rights::kQueryWatch);
    EXPECT_EQ(rights_for(*tenant, "tenant-" + std::to_string(i + 1) + "/job"), Rights::kNone);
  }
  EXPECT_EQ(table.find(4), nullptr);
}

// ---- load_tenant_file: the real disk ----

class TenantFileOnDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "shardlock_tenants_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(TenantFileOnDisk, ReadsKeyFilesBesideTheTenantFile) {
  write("a.key", hex_of(1) + "\n");
  std::filesystem::create_directory(dir_ / "keys");
  write("keys/b.key", hex_of(2) + "\n");
  const std::string path = write("tenants",
                                 "tenant a id=1 key-file=a.key\n"
                                 "tenant b id=2 key-file=keys/b.key\n"
                                 "allow a \"\" all\n");
  const TenantTableResult result = load_tenant_file(path);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.file, path);
  EXPECT_EQ(result.table->find(1)->key, key_of(1));
  EXPECT_EQ(result.table->find(2)->key, key_of(2));
}

TEST_F(TenantFileOnDisk, UnreadableFilesAreClearErrors) {
  const std::string missing = (dir_ / "missing").string();
  TenantTableResult result = load_tenant_file(missing);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.line, 0U);
  EXPECT_EQ(result.message(), missing + ": cannot read the tenant file: No such file or directory");

  result = load_tenant_file(dir_.string());
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.message().find("it is a directory"), std::string::npos) << result.message();

  const std::string huge = write("huge", std::string(kMaxTenantFileSize + 1, '#'));
  result = load_tenant_file(huge);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.message().find("larger than 16 MiB"), std::string::npos) << result.message();

  write("bad.key", "not a key\n");
  const std::string path = write("tenants", "\ntenant a id=1 key-file=bad.key\n");
  result = load_tenant_file(path);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.line, 2U);
  EXPECT_EQ(result.column, 24U);
  EXPECT_EQ(result.message().rfind(path + ":2:24: key-file=: key file ", 0), 0U)
      << result.message();
}

}  // namespace
}  // namespace shardlock::lease
