// Per-device pre-shared keys for DTLS-PSK, in a TOML file the server refuses to use when
// group or others can read it (a leaked key lets anyone post updates as that device):
//
//   # edgetrain keystore (mode 0600)
//   [devices]
//   pi-kitchen = "3f9a…"   # the PSK's bytes as hex digits
//
// Keys that add-device and rotate-key make are 32 characters of base64url text (24 random
// bytes, 192 bits), and the PSK is those 32 characters' bytes: Debian's coap-client 4.3.1
// takes -k as literal text (it has no hex form), so an operator can read /status with the
// same key (`coap-client-openssl -u NAME -k KEY`). Keys made earlier as 32 random bytes
// stay valid; they are shown as hex only.
//
// Commands that change the file (add_device, remove_device, rotate_key) hold an exclusive
// flock on KEYSTORE.lock for their read-modify-write and replace the file atomically, so
// two commands run at once both take effect, and the running server (LiveKeystore) sees
// either the old or the new file.
//
// Device names (= PSK identities) are 1–64 characters of [A-Za-z0-9._-]
// (transport::is_plain_identity, the one rule for identities).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace edgetrain::server {

class KeystoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Keystore {
 public:
  Keystore() = default;
  // Throws KeystoreError when the file is missing, readable by group or others, or not a
  // keystore (bad TOML, bad name, key not hex, shorter than 16 bytes or longer than the
  // 32 that Mbed TLS 2.28 can use, transport::kMaxPskBytes).
  static Keystore load(const std::filesystem::path& path);

  std::optional<std::vector<std::uint8_t>> key_for(std::string_view identity) const;
  bool contains(std::string_view identity) const { return keys_.find(identity) != keys_.end(); }
  std::size_t size() const { return keys_.size(); }
  const std::map<std::string, std::vector<std::uint8_t>, std::less<>>& devices() const {
    return keys_;
  }

 private:
  std::map<std::string, std::vector<std::uint8_t>, std::less<>> keys_;
};

// The keystore the running server uses: re-read when its file changes (modification or
// status-change time, size or inode), so that add-device takes effect without a restart. A file
// that no longer loads (half edited by hand, made readable by others) is reported to `log` and the
// previous keystore stays in force. Lookups stat the file; call them from one thread.
class LiveKeystore {
 public:
  using Log = std::function<void(const std::string& line)>;
  // Throws KeystoreError when the file does not load now.
  explicit LiveKeystore(std::filesystem::path path, Log log = {});
  std::optional<std::vector<std::uint8_t>> key_for(std::string_view identity);
  // key_for() for a DTLS handshake: an unknown identity is logged as a refused handshake.
  // The identity is whatever bytes the peer sent, so it is shown escaped
  // (transport::escape_untrusted): a newline or ESC in it cannot forge a log line.
  std::optional<std::vector<std::uint8_t>> handshake_key(std::string_view identity);
  bool contains(std::string_view identity);
  std::size_t size() const { return keystore_.size(); }

 private:
  struct FileVersion {
    long long modified_ns = -1, changed_ns = -1, size = -1, inode = -1;  // changed: chmod too
    bool operator==(const FileVersion&) const = default;
  };
  static FileVersion version_of(const std::filesystem::path& path);
  void reload_if_changed();

  std::filesystem::path path_;
  Log log_;
  FileVersion loaded_;
  Keystore keystore_;
};

// Adds `name` with a new printable key (random_printable_key) to the keystore at `path`
// (created with mode 0600 when missing; rewritten atomically under the lock) and returns
// the key. Throws KeystoreError for an invalid or already present name or an unsafe or
// invalid existing file.
std::vector<std::uint8_t> add_device(const std::filesystem::path& path, const std::string& name);

// Removes `name`; the running server refuses its next request (4.03) and handshake. Throws
// KeystoreError when `name` is not in the keystore.
void remove_device(const std::filesystem::path& path, const std::string& name);

// Gives `name` a new printable key and returns it; the old key no longer completes a
// handshake (sessions already open keep going until they end). Throws KeystoreError when
// `name` is not in the keystore.
std::vector<std::uint8_t> rotate_key(const std::filesystem::path& path, const std::string& name);

// 32 characters of base64url (A-Z a-z 0-9 - _) from 24 bytes of /dev/urandom, as bytes.
std::vector<std::uint8_t> random_printable_key();

// True when every byte is printable ASCII other than space (a key coap-client's -k can
// take and a shell passes unquoted).
bool is_printable_key(const std::vector<std::uint8_t>& key);

// The worker's configuration for that device, as TOML.
std::string worker_config_toml(const std::string& server_uri, const std::string& identity,
                               const std::vector<std::uint8_t>& key);

std::string to_hex(const std::vector<std::uint8_t>& bytes);

}  // namespace edgetrain::server
