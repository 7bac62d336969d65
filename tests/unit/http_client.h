// A raw HTTP/1.1 client over a loopback socket for the HTTP tests: it writes exactly the bytes a
// case needs and reads the raw answer. And a listening loopback socket (a port in use, or a stub
// server's).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice::testing {

struct Reply {
  int code = 0;
  std::string headers;  // lower case
  std::string body;
  bool closed = false;  // the server closed the connection instead of answering
};

class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~Client() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (SO_LINGER 0) instead of a FIN: a client that is gone for sure.
  void Abort() {
    if (fd_ < 0) return;
    const linger reset{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    Close();
  }
  // Sends a FIN and keeps reading (an HTTP/1.0-style client, `nc -N`).
  void ShutdownWrite() { shutdown(fd_, SHUT_WR); }
  bool connected() const { return connected_; }

  void Send(const std::string& bytes) {
    ASSERT_EQ(write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }

  // Reads one response (Content-Length framed), or notes that the connection closed.
  Reply Read(int timeout_ms = 5000) {
    Reply reply;
    while (true) {
      const size_t end = buffer_.find("\r\n\r\n");
      if (end != std::string::npos) {
        reply.headers = absl::AsciiStrToLower(buffer_.substr(0, end));
        const size_t space = reply.headers.find(' ');
        EXPECT_TRUE(absl::SimpleAtoi(reply.headers.substr(space + 1, 3), &reply.code));
        size_t length = 0;
        // The header's own line (not the tail of Inference-Header-Content-Length).
        const size_t at = reply.headers.find("\r\ncontent-length: ");
        if (at != std::string::npos) {
          const size_t value = at + 18;
          EXPECT_TRUE(absl::SimpleAtoi(
              reply.headers.substr(value, reply.headers.find("\r\n", value) - value), &length));
        }
        if (buffer_.size() >= end + 4 + length) {
          reply.body = buffer_.substr(end + 4, length);
          buffer_.erase(0, end + 4 + length);
          return reply;
        }
      }
      pollfd wait{fd_, POLLIN, 0};
      if (poll(&wait, 1, timeout_ms) <= 0) return reply;  // code 0: nothing came
      char chunk[65536];
      const ssize_t got = read(fd_, chunk, sizeof(chunk));
      if (got <= 0) {
        reply.closed = true;
        return reply;
      }
      buffer_.append(chunk, static_cast<size_t>(got));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

inline std::string Get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}

inline std::string Post(const std::string& path, const std::string& body,
                        const std::string& extra = "") {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(),
                      "\r\n", extra, "\r\n", body);
}

// A loopback socket bound to a free port, listening while it lives: a port in use.
class TakenPort {
 public:
  TakenPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t length = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~TakenPort() { Release(); }
  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace sluice::testing
