#include "common/command_line.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>

#include "shardlock/lease/duration.h"
#include "shardlock_version.h"

namespace shardlock::tools {

int usage_error(std::string_view tool, std::string_view message) {
  std::cerr << tool << ": " << message << "\nRun with --help for usage.\n";
  return kExitUsage;
}

void add_version_flag(CLI::App& app, std::string_view tool) {
  app.set_version_flag("--version", std::string(tool) + " " + std::string(kVersion),
                       "Print the version and exit");
}

void add_output_flags(CLI::App& app, OutputFlags& flags, bool with_short_w,
                      const std::string& group) {
  CLI::Option* write_out =
      app.add_option(with_short_w ? "-w,--write-out" : "--write-out", flags.write_out,
                     "Output format: text (for people) or json (one object per line, for scripts)")
          ->check(CLI::IsMember({"text", "json"}))
          ->capture_default_str();
  CLI::Option* json = app.add_flag("--json", flags.json_flag, "Same as --write-out json");
  if (!group.empty()) {
    write_out->group(group);
    json->group(group);
  }
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, std::string_view tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return usage_error(tool, e.what());
  }
  return std::nullopt;
}

int run_main(std::string_view tool, int failure_status, int (*run)(int, char**), int argc,
             char** argv) noexcept {
  try {
    const int status = run(argc, argv);
    // What a tool prints is its result: output lost to a full disk or a bad
    // descriptor must not pass for success.
    std::cout.flush();
    errno = 0;
    if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0 || !std::cout) {
      std::fprintf(stderr, "%.*s: cannot write the output to stdout%s%s\n",
                   static_cast<int>(tool.size()), tool.data(), errno != 0 ? ": " : "",
                   errno != 0 ? std::strerror(errno) : "");
      return status == 0 ? failure_status : status;
    }
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%.*s: fatal: %s\n", static_cast<int>(tool.size()), tool.data(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%.*s: fatal: unknown exception\n", static_cast<int>(tool.size()),
                 tool.data());
  }
  return failure_status;
}

DurationFlag parse_duration_flag(std::string_view flag, std::string_view text, ZeroDuration zero,
                                 std::chrono::milliseconds longest) {
  DurationFlag result;
  const std::optional<std::chrono::milliseconds> parsed = lease::parse_duration(text);
  std::string name(flag);
  if (!parsed) {
    result.error = name + ": invalid duration \"" + std::string(text) +
                   "\" (use e.g. 500ms, 1.5s, 30 (seconds), 2m)";
  } else if (parsed->count() == 0 && zero == ZeroDuration::kRejected) {
    result.error = name + ": must be more than 0";
  } else if (*parsed > longest) {
    result.error = name + ": \"" + std::string(text) + "\" is above the maximum " +
                   lease::to_string(longest) +
                   (longest == kLongestWireDuration ? " (u32 milliseconds)" : "");
  } else {
    result.value = *parsed;
  }
  return result;
}

AuthKeyFlag load_auth_key_flag(const std::string& path) {
  AuthKeyFlag result;
  if (path.empty()) return result;
  lease::AuthKeyFile loaded = lease::load_auth_key(path);
  if (loaded.key) {
    result.key = loaded.key;
  } else {
    result.error = "--auth-key: " + loaded.error;
  }
  return result;
}

}  // namespace shardlock::tools
