// The server side of TLS for transports Sluice drives itself (the HTTP port; gRPC has its own):
// an OpenSSL SSL_CTX made from PEM files (OpenSSL's libssl, the library gRPC links, not a second
// one), read again when they change, so that a certificate rotated on disk serves new connections
// without a restart. TLS 1.2 or newer, no renegotiation; with `mutual`, a client must present a
// certificate signed by the root, or its handshake fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace sluice {

class TlsServerContext {
 public:
  struct Options {
    std::string certificate_path;  // the server's certificate chain (PEM)
    std::string key_path;          // its private key (PEM)
    std::string root_path;         // with `mutual`: the CA that signs client certificates
    bool mutual = false;
    // How often the files are looked at again (their size, time and inode); 0: read once.
    std::chrono::seconds reload{60};
    // The time (null: the steady clock), for tests.
    std::function<std::chrono::steady_clock::time_point()> now;
    // Named in errors: the flags the files came from.
    std::string certificate_flag = "--grpc-server-cert";
    std::string key_flag = "--grpc-server-key";
    std::string root_flag = "--grpc-root-cert";
  };

  // Reads the files and makes the first context. INVALID_ARGUMENT naming the flag and OpenSSL's
  // reason when a file cannot be read, does not parse, or the key is not the certificate's.
  static absl::StatusOr<std::unique_ptr<TlsServerContext>> Create(Options options);
  ~TlsServerContext();

  // A new server-side SSL for one connection (accept state), from the current context: the files
  // are looked at first when `reload` has passed since the last look, and read again when they
  // changed. A set of files that does not load (a half-written rotation) keeps the previous
  // context, logged once per change. Thread-safe. Null only when OpenSSL cannot allocate.
  SSL* NewConnection();

  // Contexts made after the first (for tests and the log).
  int64_t reloads() const;

 private:
  explicit TlsServerContext(Options options) : options_(std::move(options)) {}
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Load() const;
  std::string FilesStamp() const;
  std::chrono::steady_clock::time_point Now() const {
    return options_.now ? options_.now() : std::chrono::steady_clock::now();
  }

  const Options options_;
  mutable std::mutex mutex_;
  std::shared_ptr<SSL_CTX> context_;  // guarded by mutex_
  std::string stamp_;                 // the files' stamp when context_ was made (or last refused)
  std::chrono::steady_clock::time_point next_look_{};
  int64_t reloads_ = 0;
};

// This thread's queued OpenSSL errors as one line ("no reason given" when none), emptying the
// queue.
std::string OpenSslErrors();

// The subject of the certificate `ssl`'s peer presented and the handshake verified, in RFC 2253
// form ("CN=client,O=Acme", as gRPC names it); empty when there is none.
std::string PeerCertificateSubject(const SSL* ssl);

}  // namespace sluice
