// TLS for the HTTP port: contexts from PEM files made here (a self-signed EC certificate per
// test), errors that name the flag, reload when the files change (on an injected clock), and a
// handshake between an OpenSSL client and a session from the context over a socket pair.
#include "server/os/tls_server_context.h"

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <csignal>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

namespace sluice {
namespace {

using ::testing::HasSubstr;

// A self-signed certificate for `common_name` and its key, as PEM files under `directory`.
void WriteCertificate(const std::string& directory, const std::string& name,
                      const std::string& common_name) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  ASSERT_NE(key, nullptr);
  std::unique_ptr<X509, decltype(&X509_free)> certificate(X509_new(), &X509_free);
  ASSERT_EQ(X509_set_version(certificate.get(), 2), 1);
  ASN1_INTEGER_set(X509_get_serialNumber(certificate.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(certificate.get()), 0);
  X509_gmtime_adj(X509_getm_notAfter(certificate.get()), 3600);
  X509_NAME* subject = X509_get_subject_name(certificate.get());
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(certificate.get(), subject);
  X509_set_pubkey(certificate.get(), key.get());
  ASSERT_GT(X509_sign(certificate.get(), key.get(), EVP_sha256()), 0);
  FILE* pem = fopen((directory + "/" + name + ".pem").c_str(), "w");
  ASSERT_NE(pem, nullptr);
  PEM_write_X509(pem, certificate.get());
  fclose(pem);
  FILE* private_key = fopen((directory + "/" + name + ".key").c_str(), "w");
  ASSERT_NE(private_key, nullptr);
  PEM_write_PrivateKey(private_key, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  fclose(private_key);
}

class TlsServerContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A handshake's last bytes may go to a client that has closed (the HTTP server ignores
    // SIGPIPE process-wide for the same reason).
    signal(SIGPIPE, SIG_IGN);
    char pattern[] = "/tmp/sluice-tls-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    directory_ = pattern;
    WriteCertificate(directory_, "server", "server-one");
    WriteCertificate(directory_, "other", "server-two");
  }
  void TearDown() override {
    for (const char* name : {"server.pem", "server.key", "other.pem", "other.key"})
      unlink((directory_ + "/" + name).c_str());
    rmdir(directory_.c_str());
  }
  TlsServerContext::Options Files(const std::string& certificate, const std::string& key) {
    TlsServerContext::Options options;
    options.certificate_path = directory_ + "/" + certificate + ".pem";
    options.key_path = directory_ + "/" + key + ".key";
    options.now = [this] { return now_; };
    return options;
  }
  // The common name of the certificate a handshake with `tls` shows a client (empty: failed).
  static std::string ServedName(TlsServerContext& tls) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return "";
    std::unique_ptr<SSL, decltype(&SSL_free)> server(tls.NewConnection(), &SSL_free);
    SSL_set_fd(server.get(), fds[0]);
    std::thread accepting([&server] { SSL_do_handshake(server.get()); });
    std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> client_context(
        SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
    std::unique_ptr<SSL, decltype(&SSL_free)> client(SSL_new(client_context.get()), &SSL_free);
    SSL_set_fd(client.get(), fds[1]);
    std::string name;
    if (SSL_connect(client.get()) == 1) {
      X509* certificate = SSL_get0_peer_certificate(client.get());
      char text[256] = {};
      X509_NAME_get_text_by_NID(X509_get_subject_name(certificate), NID_commonName, text,
                                sizeof(text));
      name = text;
    }
    SSL_shutdown(client.get());
    close(fds[1]);
    accepting.join();
    close(fds[0]);
    return name;
  }

  std::string directory_;
  std::chrono::steady_clock::time_point now_{std::chrono::hours(1)};
};

TEST_F(TlsServerContextTest, ServesItsCertificateInAHandshake) {
  auto tls = TlsServerContext::Create(Files("server", "server"));
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_EQ(ServedName(**tls), "server-one");
  EXPECT_EQ(PeerCertificateSubject(nullptr), "");
}

TEST_F(TlsServerContextTest, RefusesFilesThatDoNotMakeAContextNamingTheFlag) {
  auto mismatched = TlsServerContext::Create(Files("server", "other"));
  ASSERT_FALSE(mismatched.ok());
  EXPECT_THAT(std::string(mismatched.status().message()), HasSubstr("--grpc-server-key"));
  auto missing = TlsServerContext::Create(Files("absent", "server"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("--grpc-server-cert: cannot use"));
  TlsServerContext::Options mutual = Files("server", "server");
  mutual.mutual = true;
  mutual.root_path = directory_ + "/absent.pem";
  auto no_root = TlsServerContext::Create(mutual);
  ASSERT_FALSE(no_root.ok());
  EXPECT_THAT(std::string(no_root.status().message()), HasSubstr("--grpc-root-cert"));
}

TEST_F(TlsServerContextTest, FilesChangedOnDiskServeNewConnectionsAfterTheReloadInterval) {
  auto made = TlsServerContext::Create(Files("server", "server"));
  ASSERT_TRUE(made.ok()) << made.status();
  TlsServerContext& tls = **made;
  // A half-written rotation (the certificate is new, the key not yet) keeps the old context.
  rename((directory_ + "/other.pem").c_str(), (directory_ + "/server.pem").c_str());
  now_ += std::chrono::seconds(61);
  EXPECT_EQ(ServedName(tls), "server-one");
  EXPECT_EQ(tls.reloads(), 0);
  // The key follows: not looked at again before the interval has passed...
  rename((directory_ + "/other.key").c_str(), (directory_ + "/server.key").c_str());
  now_ += std::chrono::seconds(30);
  EXPECT_EQ(ServedName(tls), "server-one");
  // ...and then the new pair serves.
  now_ += std::chrono::seconds(31);
  EXPECT_EQ(ServedName(tls), "server-two");
  EXPECT_EQ(tls.reloads(), 1);
}

}  // namespace
}  // namespace sluice
