#include "server/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace edgetrain::server {
namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path) {
  throw std::system_error(errno, std::generic_category(), what + " " + path.string());
}

}  // namespace

void sync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open", path);
  if (::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    fail("cannot fsync", path);
  }
  ::close(fd);
}

void durable_rename(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail("cannot rename " + from.string() + " to", to);
  std::filesystem::path directory = to.parent_path();
  sync_path(directory.empty() ? std::filesystem::path(".") : directory);
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes,
                           unsigned mode) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) fail("cannot create", temporary);
  // open() applies the umask; the caller's mode is what the file must end up with.
  if (::fchmod(fd, mode) != 0) {
    ::close(fd);
    fail("cannot chmod", temporary);
  }
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("cannot write", temporary);
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("cannot fsync", temporary);
  }
  ::close(fd);
  durable_rename(temporary, path);
}

}  // namespace edgetrain::server
