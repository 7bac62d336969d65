#include "server/os/pem.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace sluice {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is required"));
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::ostringstream contents;
  contents << file.rdbuf();
  std::string pem = contents.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM file (no -----BEGIN line)"));
  }
  return pem;
}

absl::Status CheckKeyPair(const std::string& certificate_pem, const std::string& key_pem,
                          const std::string& what) {
  auto bio = [](const std::string& text) {
    return std::unique_ptr<BIO, decltype(&BIO_free)>(
        BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), &BIO_free);
  };
  auto certificate_bio = bio(certificate_pem);
  auto key_bio = bio(key_pem);
  std::unique_ptr<X509, decltype(&X509_free)> certificate(
      PEM_read_bio_X509(certificate_bio.get(), nullptr, nullptr, nullptr), &X509_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (certificate == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the certificate does not parse"));
  }
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the private key does not parse"));
  }
  if (X509_check_private_key(certificate.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the private key is not the certificate's (they do not match)"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
