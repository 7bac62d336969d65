#include "server/os/tls_server_context.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice {

std::string OpenSslErrors() {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    if (!text.empty()) text += "; ";
    text += buffer;
  }
  return text.empty() ? std::string("no reason given") : text;
}

absl::StatusOr<std::unique_ptr<TlsServerContext>> TlsServerContext::Create(Options options) {
  std::unique_ptr<TlsServerContext> tls(new TlsServerContext(std::move(options)));
  const std::string stamp = tls->FilesStamp();
  absl::StatusOr<std::shared_ptr<SSL_CTX>> context = tls->Load();
  if (!context.ok()) return context.status();
  tls->context_ = *std::move(context);
  tls->stamp_ = stamp;
  tls->next_look_ = tls->Now() + tls->options_.reload;
  return tls;
}

TlsServerContext::~TlsServerContext() = default;

std::string TlsServerContext::FilesStamp() const {
  std::string stamp;
  for (const std::string* path :
       {&options_.certificate_path, &options_.key_path, &options_.root_path}) {
    struct stat info {};
    if (path->empty() || stat(path->c_str(), &info) != 0) {
      stamp += "-;";
      continue;
    }
    absl::StrAppend(&stamp, info.st_ino, ":", info.st_size, ":", info.st_mtim.tv_sec, ".",
                    info.st_mtim.tv_nsec, ";");
  }
  return stamp;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> TlsServerContext::Load() const {
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> context(SSL_CTX_new(TLS_server_method()), &SSL_CTX_free);
  if (context == nullptr)
    return absl::InternalError(absl::StrCat("cannot make a TLS context: ", OpenSslErrors()));
  SSL_CTX* raw = context.get();
  SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION);
  // A client that closes without close_notify (most HTTP clients between requests) has said
  // goodbye, not failed.
  SSL_CTX_set_options(raw, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                               SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Resumed sessions (tickets) need a context id when client certificates are verified: without
  // one OpenSSL fails every resumption.
  static constexpr unsigned char kSessionContext[] = "sluice-http";
  SSL_CTX_set_session_id_context(raw, kSessionContext, sizeof(kSessionContext) - 1);
  // Writes resume with the rest of a buffer whose front may have been written (partial writes);
  // the buffer does not move while it waits.
  SSL_CTX_set_mode(raw, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(raw, options_.certificate_path.c_str()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(options_.certificate_flag, ": cannot use ",
                                                   options_.certificate_path, " (", OpenSslErrors(),
                                                   ")"));
  }
  if (SSL_CTX_use_PrivateKey_file(raw, options_.key_path.c_str(), SSL_FILETYPE_PEM) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(options_.key_flag, ": cannot use ",
                                                   options_.key_path, " (", OpenSslErrors(), ")"));
  }
  if (SSL_CTX_check_private_key(raw) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        options_.key_flag, ": the private key is not the certificate's (", OpenSslErrors(), ")"));
  }
  if (options_.mutual) {
    if (SSL_CTX_load_verify_locations(raw, options_.root_path.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          options_.root_flag, ": cannot use ", options_.root_path, " (", OpenSslErrors(), ")"));
    }
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(options_.root_path.c_str()))
      SSL_CTX_set_client_CA_list(raw, names);
    SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return context;
}

SSL* TlsServerContext::NewConnection() {
  std::shared_ptr<SSL_CTX> context;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Now();
    if (options_.reload.count() > 0 && now >= next_look_) {
      next_look_ = now + options_.reload;
      const std::string stamp = FilesStamp();
      if (stamp != stamp_) {
        stamp_ = stamp;  // a set that fails is not tried again until the files change again
        absl::StatusOr<std::shared_ptr<SSL_CTX>> loaded = Load();
        if (loaded.ok()) {
          context_ = *std::move(loaded);
          ++reloads_;
          spdlog::info("event=tls_reloaded transport=http certificate={}",
                       options_.certificate_path);
        } else {
          spdlog::warn("event=tls_reload_failed transport=http reason=\"{}\" keeping=previous",
                       std::string(loaded.status().message()));
        }
      }
    }
    context = context_;
  }
  SSL* ssl = SSL_new(context.get());  // holds its own reference to the context
  if (ssl != nullptr) SSL_set_accept_state(ssl);
  return ssl;
}

int64_t TlsServerContext::reloads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reloads_;
}

std::string PeerCertificateSubject(const SSL* ssl) {
  if (ssl == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return "";
  X509* certificate = SSL_get0_peer_certificate(ssl);
  if (certificate == nullptr) return "";
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  if (bio == nullptr ||
      X509_NAME_print_ex(bio.get(), X509_get_subject_name(certificate), 0, XN_FLAG_RFC2253) < 0)
    return "";
  char* data = nullptr;
  const long length = BIO_get_mem_data(bio.get(), &data);
  return length > 0 ? std::string(data, static_cast<size_t>(length)) : std::string();
}

}  // namespace sluice
