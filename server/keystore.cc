#include "server/keystore.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "server/durable_file.h"
#include "transport/coap_dtls.h"
#include "transport/identity.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

constexpr std::size_t kMinimumKeyBytes = 16;

// Said whenever a key is refused for its length, so the operator learns both limits.
std::string key_length_rule() {
  return "between " + std::to_string(kMinimumKeyBytes) + " and " +
         std::to_string(transport::kMaxPskBytes) + " bytes (" +
         std::to_string(transport::kMaxPskBytes) +
         " = MBEDTLS_PSK_MAX_LEN, the longest pre-shared key Mbed TLS 2.28 can use)";
}

std::optional<std::vector<std::uint8_t>> from_hex(std::string_view hex) {
  if (hex.size() % 2) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<std::uint8_t> bytes;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int high = nibble(hex[i]), low = nibble(hex[i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    bytes.push_back(static_cast<std::uint8_t>(high * 16 + low));
  }
  return bytes;
}

void check_private(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw KeystoreError("cannot stat the keystore " + path.string());
  if (info.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(info.st_mode & 07777));
    throw KeystoreError("the keystore " + path.string() + " has mode " + mode +
                        ": group or others may access it; run chmod 600 " + path.string());
  }
}

std::vector<std::uint8_t> random_bytes(std::size_t count) {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  std::vector<std::uint8_t> bytes(count);
  if (!urandom.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(count)))
    throw KeystoreError("cannot read /dev/urandom");
  return bytes;
}

}  // namespace

std::string to_hex(const std::vector<std::uint8_t>& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (std::uint8_t b : bytes) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

Keystore Keystore::load(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw KeystoreError("no keystore at " + path.string());
  check_private(path);
  toml::table table;
  try {
    table = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    throw KeystoreError("the keystore " + path.string() +
                        " is not valid TOML: " + transport::escape_untrusted(e.description()));
  }
  Keystore keystore;
  const toml::table* devices = table["devices"].as_table();
  if (!devices) return keystore;  // no [devices] yet: nobody may connect
  for (const auto& [name, value] : *devices) {
    const std::string identity(name.str());
    if (!transport::is_plain_identity(identity))
      throw KeystoreError("keystore: invalid device name '" +
                          transport::escape_untrusted(identity) + "'");
    const auto hex = value.value<std::string>();
    auto key = hex ? from_hex(*hex) : std::nullopt;
    if (!key) throw KeystoreError("keystore: the key of '" + identity + "' is not hex");
    if (key->size() < kMinimumKeyBytes || key->size() > transport::kMaxPskBytes)
      throw KeystoreError("keystore: the key of '" + identity + "' has " +
                          std::to_string(key->size()) + " bytes; keys must have " +
                          key_length_rule());
    keystore.keys_[identity] = std::move(*key);
  }
  return keystore;
}

std::optional<std::vector<std::uint8_t>> Keystore::key_for(std::string_view identity) const {
  auto it = keys_.find(identity);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

namespace {

// Holds an exclusive flock on PATH.lock (a file of its own, so that the atomic rename of the
// keystore cannot swap the locked inode away) for the lifetime of the object.
class KeystoreLock {
 public:
  explicit KeystoreLock(const std::filesystem::path& keystore) {
    std::filesystem::path lock_path = keystore;
    lock_path += ".lock";
    fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0)
      throw KeystoreError("cannot open the lock file " + lock_path.string() + ": " +
                          std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd_);
      throw KeystoreError("cannot lock " + lock_path.string() + ": " + std::strerror(error));
    }
  }
  ~KeystoreLock() { ::close(fd_); }  // closing releases the lock
  KeystoreLock(const KeystoreLock&) = delete;
  KeystoreLock& operator=(const KeystoreLock&) = delete;

 private:
  int fd_ = -1;
};

// The read-modify-write of every command that changes the keystore: under the lock, the
// current file (refused when it is not a valid keystore), `change` applied to its
// [devices] table, the result written atomically with mode 0600.
void edit_keystore(const std::filesystem::path& path,
                   const std::function<void(toml::table& devices)>& change) {
  KeystoreLock lock(path);
  toml::table table;
  if (std::filesystem::exists(path)) {
    check_private(path);
    Keystore::load(path);  // refuse to rewrite a file that is not a valid keystore
    table = toml::parse_file(path.string());
  }
  if (!table.contains("devices")) table.insert("devices", toml::table{});
  change(*table["devices"].as_table());
  std::ostringstream text;
  text << "# edgetrain keystore: device name = PSK as hex. Keep it mode 0600.\n" << table << "\n";
  const std::string bytes = text.str();
  write_file_atomically(
      path, std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()), 0600);
}

void check_name(const std::string& name) {
  if (!transport::is_plain_identity(name))
    throw KeystoreError("invalid device name '" + transport::escape_untrusted(name) +
                        "': use 1-64 characters of A-Z a-z 0-9 . _ -");
}

}  // namespace

std::vector<std::uint8_t> random_printable_key() {
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const std::vector<std::uint8_t> random = random_bytes(24);
  std::vector<std::uint8_t> key;
  for (std::size_t i = 0; i < random.size(); i += 3) {
    const unsigned bits = random[i] << 16 | random[i + 1] << 8 | random[i + 2];
    for (int shift = 18; shift >= 0; shift -= 6)
      key.push_back(static_cast<std::uint8_t>(alphabet[(bits >> shift) & 63]));
  }
  return key;
}

bool is_printable_key(const std::vector<std::uint8_t>& key) {
  return !key.empty() &&
         std::all_of(key.begin(), key.end(), [](std::uint8_t b) { return b > 0x20 && b < 0x7f; });
}

std::vector<std::uint8_t> add_device(const std::filesystem::path& path, const std::string& name) {
  check_name(name);
  std::vector<std::uint8_t> key = random_printable_key();
  edit_keystore(path, [&](toml::table& devices) {
    if (devices.contains(name))
      throw KeystoreError("device '" + name + "' is already in " + path.string());
    devices.insert(name, to_hex(key));
  });
  return key;
}

void remove_device(const std::filesystem::path& path, const std::string& name) {
  check_name(name);
  if (!std::filesystem::exists(path)) throw KeystoreError("no keystore at " + path.string());
  edit_keystore(path, [&](toml::table& devices) {
    if (!devices.contains(name))
      throw KeystoreError("device '" + name + "' is not in " + path.string());
    devices.erase(name);
  });
}

std::vector<std::uint8_t> rotate_key(const std::filesystem::path& path, const std::string& name) {
  check_name(name);
  if (!std::filesystem::exists(path)) throw KeystoreError("no keystore at " + path.string());
  std::vector<std::uint8_t> key = random_printable_key();
  edit_keystore(path, [&](toml::table& devices) {
    if (!devices.contains(name))
      throw KeystoreError("device '" + name + "' is not in " + path.string());
    devices.insert_or_assign(name, to_hex(key));
  });
  return key;
}

std::string worker_config_toml(const std::string& server_uri, const std::string& identity,
                               const std::vector<std::uint8_t>& key) {
  toml::table table{{"server", server_uri}, {"identity", identity}, {"key_hex", to_hex(key)}};
  std::ostringstream text;
  text << "# edgetrain worker configuration for device '" << identity
       << "' (keep it private: it holds the key)\n";
  if (is_printable_key(key))
    text << "# key_hex is the hex of the text key " << std::string(key.begin(), key.end())
         << "; to read /status with it:\n#   coap-client-openssl -m get -u " << identity << " -k "
         << std::string(key.begin(), key.end()) << " " << server_uri << "/status\n";
  text << table << "\n";
  return text.str();
}

LiveKeystore::LiveKeystore(std::filesystem::path path, Log log)
    : path_(std::move(path)), log_(std::move(log)) {
  loaded_ = version_of(path_);
  keystore_ = Keystore::load(path_);
}

LiveKeystore::FileVersion LiveKeystore::version_of(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return {};
  return {info.st_mtim.tv_sec * 1000000000LL + info.st_mtim.tv_nsec,
          info.st_ctim.tv_sec * 1000000000LL + info.st_ctim.tv_nsec,
          static_cast<long long>(info.st_size), static_cast<long long>(info.st_ino)};
}

void LiveKeystore::reload_if_changed() {
  const FileVersion now = version_of(path_);
  if (now.modified_ns < 0 || now == loaded_) return;  // gone for a moment, or unchanged
  loaded_ = now;  // a bad file is reported once, not at every lookup
  try {
    keystore_ = Keystore::load(path_);
    if (log_) log_("keystore reloaded: " + std::to_string(keystore_.size()) + " devices");
  } catch (const std::exception& e) {
    if (log_) log_(std::string("keystore not reloaded, keeping the previous one: ") + e.what());
  }
}

std::optional<std::vector<std::uint8_t>> LiveKeystore::key_for(std::string_view identity) {
  reload_if_changed();
  return keystore_.key_for(identity);
}

std::optional<std::vector<std::uint8_t>> LiveKeystore::handshake_key(std::string_view identity) {
  auto key = key_for(identity);
  if (!key && log_)
    log_("refused a DTLS handshake from unknown identity '" +
         transport::escape_untrusted(identity) + "'");
  return key;
}

bool LiveKeystore::contains(std::string_view identity) {
  reload_if_changed();
  return keystore_.contains(identity);
}

}  // namespace edgetrain::server
