// See daemon.h.
#include "support/daemon.h"

#include <regex>

namespace shardlock::test_support {

std::string ready_listen_address(const std::string& line) {
  static const std::regex kListen(R"re("listen":"([^"]+:[0-9]+)")re");
  std::smatch m;
  if (line.find("\"ready\"") == std::string::npos || !std::regex_search(line, m, kListen)) {
    return {};
  }
  return m[1].str();
}

std::uint16_t ready_port(const std::string& line) {
  static const std::regex kPort(R"re("port":([0-9]+))re");
  std::smatch m;
  if (line.find("\"ready\"") == std::string::npos || !std::regex_search(line, m, kPort)) return 0;
  return static_cast<std::uint16_t>(std::stoi(m[1].str()));
}

std::string start_daemon(ChildProcess& process, const std::vector<std::string>& argv,
                         ChildOptions options, std::chrono::milliseconds timeout,
                         std::string& why) {
  options.capture_stdout = true;
  if (!process.start(argv, options)) {
    why = "cannot start " + (argv.empty() ? std::string("(nothing)") : argv[0]) + ": " +
          process.error();
    return {};
  }
  const std::string ready = process.read_line(timeout);
  std::string address = ready_listen_address(ready);
  if (address.empty()) why = "ready line: '" + ready + "'";
  return address;
}

}  // namespace shardlock::test_support
