// A real etcd for the cluster tests: Debian's etcd-server started on free
// loopback ports with a temporary data directory, stopped (and the directory
// removed) when the fixture goes. Without etcd on this machine the test
// program exits 77, which ctest counts as skipped (SKIP_RETURN_CODE).
//
// Thread safety: one thread owns the fixture.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "etcd_client.h"

namespace sluice::test {

inline const char* etcd_binary() {
  if (const char* e = std::getenv("SLUICE_ETCD"); e && *e) return e;
  return "/usr/bin/etcd";
}

// A loopback port nobody listens on now.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// A child process: started with fork/exec, killed by its pid.
struct Child {
  pid_t pid = -1;
  static Child spawn(const std::vector<std::string>& argv, const std::string& log) {
    Child c;
    c.pid = ::fork();
    if (c.pid == 0) {
      std::FILE* f = std::freopen(log.c_str(), "a", stdout);
      if (f != nullptr) ::dup2(::fileno(stdout), 2);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      std::_Exit(127);
    }
    return c;
  }
  void signal(int sig) const {
    if (pid > 0) ::kill(pid, sig);
  }
  // Kills (SIGKILL unless told) and reaps.
  void stop(int sig = SIGKILL) {
    if (pid <= 0) return;
    ::kill(pid, sig);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
  }
  bool running() const {
    int status = 0;
    return pid > 0 && ::waitpid(pid, &status, WNOHANG) == 0;
  }
};

class EtcdServer {
 public:
  EtcdServer() {
    if (::access(etcd_binary(), X_OK) != 0) {
      std::fprintf(stderr, "etcd not found at %s: skipping\n", etcd_binary());
      std::exit(77);
    }
    char tmpl[] = "/tmp/sluice-etcd-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    for (int attempt = 0; attempt < 5 && url_.empty(); ++attempt) {
      const int client = free_port();
      const int peer = free_port();
      const std::string c = "http://127.0.0.1:" + std::to_string(client);
      const std::string p = "http://127.0.0.1:" + std::to_string(peer);
      child_ = Child::spawn(
          {etcd_binary(), "--data-dir", dir_ + "/data", "--name", "test", "--listen-client-urls", c,
           "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls",
           p, "--initial-cluster", "test=" + p, "--log-level", "error"},
          dir_ + "/etcd.log");
      cluster::EtcdOptions o;
      o.endpoints = {c};
      o.timeout = std::chrono::milliseconds(500);
      auto client_or = cluster::EtcdClient::create(o);
      // Polled for up to 30 s: etcd starts slowly on a loaded machine.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (std::chrono::steady_clock::now() < give_up) {
        if (client_or && (*client_or)->range("/probe")) {
          url_ = c;
          break;
        }
        if (!child_.running()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (url_.empty()) child_.stop();
    }
    if (url_.empty()) {
      std::fprintf(stderr, "etcd did not start (log in %s)\n", dir_.c_str());
      std::exit(1);
    }
  }
  ~EtcdServer() {
    child_.stop(SIGTERM);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // Stops etcd now (the clients then find it unreachable).
  void kill() { child_.stop(SIGKILL); }

  const std::string& url() const { return url_; }
  const std::string& dir() const { return dir_; }
  std::unique_ptr<cluster::EtcdClient> client(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) const {
    cluster::EtcdOptions o;
    o.endpoints = {url_};
    o.timeout = timeout;
    auto c = cluster::EtcdClient::create(o);
    return std::move(c.value());
  }

 private:
  std::string dir_;
  std::string url_;
  Child child_;
};

}  // namespace sluice::test
