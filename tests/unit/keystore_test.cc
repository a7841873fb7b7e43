// Keystore: add-device writes a private file with a fresh random key, load refuses files
// that group or others can read, bad names and duplicates are refused, and the printed
// worker configuration is TOML holding the same identity and key.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>
#include <cctype>
#include <sstream>
#include <toml++/toml.h>

#include "server/keystore.h"

namespace {

using namespace edgetrain::server;

class KeystoreFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("edgetrain-keys-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ / "keys.toml";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_, path_;
};

TEST_F(KeystoreFile, AddDeviceCreatesAPrivateFileWithDistinctRandomKeys) {
  const auto key1 = add_device(path_, "pi-01");
  const auto key2 = add_device(path_, "pi.kitchen_2");
  EXPECT_EQ(key1.size(), 32u);
  EXPECT_NE(key1, key2);
  struct stat info {};
  ASSERT_EQ(::stat(path_.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  const Keystore keystore = Keystore::load(path_);
  EXPECT_EQ(keystore.size(), 2u);
  EXPECT_EQ(keystore.key_for("pi-01"), key1);
  EXPECT_EQ(keystore.key_for("pi.kitchen_2"), key2);
  EXPECT_FALSE(keystore.key_for("pi-03").has_value());  // what the handshake refuses
}

TEST_F(KeystoreFile, DuplicateAndInvalidNamesAreRefused) {
  add_device(path_, "pi-01");
  EXPECT_THROW(add_device(path_, "pi-01"), KeystoreError);
  EXPECT_THROW(add_device(path_, ""), KeystoreError);
  EXPECT_THROW(add_device(path_, "has space"), KeystoreError);
  EXPECT_THROW(add_device(path_, "quote\""), KeystoreError);
  EXPECT_EQ(Keystore::load(path_).size(), 1u);
}

TEST_F(KeystoreFile, ReadableByGroupOrOthersIsRefused) {
  add_device(path_, "pi-01");
  for (unsigned mode : {0640u, 0604u, 0660u}) {
    std::filesystem::permissions(path_, static_cast<std::filesystem::perms>(mode));
    EXPECT_THROW(Keystore::load(path_), KeystoreError) << std::oct << mode;
    EXPECT_THROW(add_device(path_, "pi-02"), KeystoreError) << std::oct << mode;
  }
  std::filesystem::permissions(path_, static_cast<std::filesystem::perms>(0600));
  EXPECT_NO_THROW(Keystore::load(path_));
}

TEST_F(KeystoreFile, ShortOrNonHexKeysAreRefused) {
  for (const char* text :
       {"[devices]\na = \"00ff\"\n", "[devices]\na = \"zz00112233445566778899aabbccddeeff\"\n",
        "[devices\n"}) {
    {
      std::ofstream out(path_);
      out << text;
    }
    std::filesystem::permissions(path_, static_cast<std::filesystem::perms>(0600));
    EXPECT_THROW(Keystore::load(path_), KeystoreError) << text;
  }
}

// Mbed TLS 2.28 cannot use a PSK above MBEDTLS_PSK_MAX_LEN = 32 bytes: every handshake of
// such a device would fail as if its key were wrong, so the keystore refuses it up front.
TEST_F(KeystoreFile, KeysLongerThanMbedTlsCanUseAreRefusedNamingTheLimit) {
  {
    std::ofstream out(path_);
    out << "[devices]\nlong = \"" << std::string(2 * 33, 'a') << "\"\n";
  }
  std::filesystem::permissions(path_, static_cast<std::filesystem::perms>(0600));
  try {
    Keystore::load(path_);
    ADD_FAILURE() << "a 33-byte key was accepted";
  } catch (const KeystoreError& e) {
    EXPECT_NE(std::string(e.what()).find("MBEDTLS_PSK_MAX_LEN"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("32"), std::string::npos) << e.what();
  }
  {
    std::ofstream out(path_);
    out << "[devices]\nlongest = \"" << std::string(2 * 32, 'a') << "\"\n";
  }
  EXPECT_EQ(Keystore::load(path_).size(), 1u);  // exactly the limit is fine
}

TEST_F(KeystoreFile, NewKeysArePrintableForCoapClient) {
  // coap-client 4.3.1 takes -k as literal text: a made key must be text it can pass.
  const auto key = add_device(path_, "pi-01");
  EXPECT_EQ(key.size(), 32u);
  EXPECT_TRUE(is_printable_key(key));
  for (std::uint8_t b : key)
    EXPECT_TRUE(std::isalnum(b) || b == '-' || b == '_') << static_cast<int>(b);
  EXPECT_EQ(Keystore::load(path_).key_for("pi-01"), key);
  EXPECT_NE(random_printable_key(), random_printable_key());
  EXPECT_FALSE(is_printable_key({'a', 0, 'b'}));
  EXPECT_FALSE(is_printable_key({'a', ' ', 'b'}));
}

TEST_F(KeystoreFile, RemoveAndRotateChangeOnlyTheirDevice) {
  const auto key1 = add_device(path_, "pi-01");
  const auto key2 = add_device(path_, "pi-02");
  const auto rotated = rotate_key(path_, "pi-01");
  EXPECT_NE(rotated, key1);
  EXPECT_EQ(Keystore::load(path_).key_for("pi-01"), rotated);
  EXPECT_EQ(Keystore::load(path_).key_for("pi-02"), key2);
  remove_device(path_, "pi-02");
  EXPECT_FALSE(Keystore::load(path_).contains("pi-02"));
  EXPECT_EQ(Keystore::load(path_).key_for("pi-01"), rotated);
  EXPECT_THROW(remove_device(path_, "pi-02"), KeystoreError);
  EXPECT_THROW(rotate_key(path_, "pi-02"), KeystoreError);
  EXPECT_THROW(remove_device(dir_ / "missing.toml", "pi-01"), KeystoreError);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "missing.toml"));
}

TEST_F(KeystoreFile, ConcurrentAddsLoseNothing) {
  // Each thread is another process in real use; the flock serialises them the same way.
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; i++)
    threads.emplace_back([this, i] { add_device(path_, "pi-" + std::to_string(i)); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(Keystore::load(path_).size(), 16u);
}

TEST_F(KeystoreFile, WorkerConfigurationIsTomlWithTheSameKey) {
  const auto key = add_device(path_, "pi-01");
  const std::string text = worker_config_toml("coaps://192.0.2.1:5684", "pi-01", key);
  const toml::table config = toml::parse(text);
  EXPECT_EQ(config["server"].value<std::string>(), "coaps://192.0.2.1:5684");
  EXPECT_EQ(config["identity"].value<std::string>(), "pi-01");
  EXPECT_EQ(config["key_hex"].value<std::string>(), to_hex(key));
}

// The server's LiveKeystore: a device added while it runs is known at the next lookup;
// a file that stops loading leaves the previous keys in force, and is reported.
TEST_F(KeystoreFile, LiveKeystoreReloadsWhenTheFileChanges) {
  add_device(path_, "pi-01");
  std::vector<std::string> log;
  LiveKeystore live(path_, [&](const std::string& line) { log.push_back(line); });
  EXPECT_EQ(live.size(), 1u);
  EXPECT_FALSE(live.contains("pi-02"));
  const auto key2 = add_device(path_, "pi-02");
  EXPECT_TRUE(live.contains("pi-02"));
  EXPECT_EQ(live.key_for("pi-02"), key2);
  EXPECT_EQ(live.size(), 2u);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("keystore reloaded: 2 devices"), std::string::npos) << log[0];
  EXPECT_TRUE(live.contains("pi-02"));  // unchanged file: no second reload
  EXPECT_EQ(log.size(), 1u);
}

TEST_F(KeystoreFile, LiveKeystoreKeepsThePreviousKeysWhenTheNewFileIsBad) {
  const auto key1 = add_device(path_, "pi-01");
  std::vector<std::string> log;
  LiveKeystore live(path_, [&](const std::string& line) { log.push_back(line); });
  {
    std::ofstream out(path_, std::ios::trunc);
    out << "[devices\npi-03 = \"00\"\n";  // half edited: not TOML
  }
  EXPECT_TRUE(live.contains("pi-01"));
  EXPECT_EQ(live.key_for("pi-01"), key1);
  EXPECT_FALSE(live.contains("pi-03"));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("keystore not reloaded, keeping the previous one"), std::string::npos)
      << log[0];
  // Readable by others: refused the same way.
  add_device(dir_ / "other.toml", "pi-04");
  std::filesystem::rename(dir_ / "other.toml", path_);
  std::filesystem::permissions(path_, static_cast<std::filesystem::perms>(0644));
  EXPECT_FALSE(live.contains("pi-04"));
  EXPECT_TRUE(live.contains("pi-01"));
  // Fixed: the new file is taken.
  std::filesystem::permissions(path_, static_cast<std::filesystem::perms>(0600));
  EXPECT_TRUE(live.contains("pi-04"));
  EXPECT_FALSE(live.contains("pi-01"));
}

// A PSK identity is whatever bytes a peer sends in its ClientHello: one with a newline and
// an ESC sequence (which forged log lines and drove the terminal before) is logged as one
// line with both escaped. So is a device name with them in a hand-edited keystore.
TEST_F(KeystoreFile, UntrustedIdentitiesAreLoggedAsOneEscapedLine) {
  add_device(path_, "pi-01");
  std::vector<std::string> log;
  LiveKeystore live(path_, [&](const std::string& line) { log.push_back(line); });
  const std::string forged = "x'\n2026-11-23T00:00:00.000Z version 999 applied\x1b[2J";
  EXPECT_FALSE(live.handshake_key(forged).has_value());
  EXPECT_TRUE(live.handshake_key("pi-01").has_value());  // known devices are not logged here
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0],
            "refused a DTLS handshake from unknown identity "
            "'x\\x27\\x0a2026-11-23T00:00:00.000Z version 999 applied\\x1b[2J'");

  {
    std::ofstream out(path_, std::ios::trunc);
    out << "[devices]\n\"evil\\nname\\u001b[31m\" = \"" << std::string(64, 'a') << "\"\n";
  }
  EXPECT_FALSE(live.contains("pi-02"));
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[1].find("invalid device name 'evil\\x0aname\\x1b[31m'"), std::string::npos)
      << log[1];
  for (const std::string& line : log) {
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  }
}

TEST_F(KeystoreFile, LiveKeystoreRefusesABadFileAtStart) {
  {
    std::ofstream out(path_);
    out << "[devices\n";
  }
  std::filesystem::permissions(path_, static_cast<std::filesystem::perms>(0600));
  EXPECT_THROW(LiveKeystore{path_}, KeystoreError);
}

}  // namespace
