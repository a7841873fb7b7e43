#include "model/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <system_error>

#include "model/file_reading.h"

namespace edgetrain::runtime {

DataError::DataError(std::string file, std::string reason)
    : std::runtime_error(file + ": " + reason),
      file_(std::move(file)),
      reason_(std::move(reason)) {}

namespace {

using detail::errno_text;
using detail::FileDescriptor;
using detail::pread_fully;

std::uint32_t read_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         p[3];
}

std::string hex_byte(std::uint8_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[value >> 4] + kDigits[value & 15];
}

std::string type_name(std::uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "unknown";
  }
}

struct IdxHeader {
  std::vector<std::uint32_t> dims;
  std::size_t header_bytes = 0;   // magic and dimensions
  std::size_t payload_bytes = 0;  // the product of the dimensions
};

// Checks the header at the front of `bytes`, which hold the whole file or at least its
// whole header when the file has one (a shorter `bytes` is the whole file).
IdxHeader check_header(std::span<const std::uint8_t> bytes, const std::string& name,
                       const IdxLimits& limits) {
  if (bytes.empty()) throw DataError(name, "file is empty");
  if (bytes.size() < 4)
    throw DataError(name, "file is " + std::to_string(bytes.size()) +
                              " bytes, shorter than the 4-byte IDX magic");
  if (bytes[0] != 0 || bytes[1] != 0)
    throw DataError(name, "not an IDX file (magic does not start with two zero bytes)");
  if (bytes[2] != kIdxTypeUnsignedByte)
    throw DataError(name, "IDX type byte " + hex_byte(bytes[2]) + " (" + type_name(bytes[2]) +
                              ") is not supported; expected 0x08 (unsigned byte)");
  const std::uint32_t dim_count = bytes[3];
  if (dim_count == 0 || dim_count > limits.max_dimensions)
    throw DataError(name, "IDX has " + std::to_string(dim_count) + " dimensions; expected 1 to " +
                              std::to_string(limits.max_dimensions));
  IdxHeader header;
  header.header_bytes = 4 + 4 * std::size_t{dim_count};
  if (bytes.size() < header.header_bytes)
    throw DataError(name, "truncated header: " + std::to_string(bytes.size()) +
                              " bytes, the header needs " + std::to_string(header.header_bytes));
  header.payload_bytes = 1;
  for (std::uint32_t d = 0; d < dim_count; ++d) {
    const std::uint32_t dim = read_be32(bytes.data() + 4 + 4 * d);
    if (dim == 0) throw DataError(name, "dimension " + std::to_string(d) + " is zero (no data)");
    // Checked before multiplying so the product can neither overflow nor exceed the cap.
    if (header.payload_bytes > limits.max_payload_bytes / dim)
      throw DataError(name, "dimensions ask for more than the cap of " +
                                std::to_string(limits.max_payload_bytes) + " bytes");
    header.payload_bytes *= dim;
    header.dims.push_back(dim);
  }
  return header;
}

DataError truncated_payload(const std::string& name, std::size_t expected, std::size_t actual) {
  return DataError(name, "truncated: header says " + std::to_string(expected) +
                             " data bytes, file has " + std::to_string(actual));
}

DataError trailing_payload(const std::string& name, std::size_t extra, std::size_t expected) {
  return DataError(name, std::to_string(extra) + " bytes after the " + std::to_string(expected) +
                             " data bytes the header announces");
}


// A file's bytes (decompressed), front to back.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Copies the next `n` bytes to `out`, or skips them when `out` is null; returns how many,
  // fewer than `n` only at the end of the data.
  virtual std::size_t read(std::uint8_t* out, std::size_t n) = 0;
  // Whether the bytes come out of a gzip stream (caps count decompressed bytes).
  virtual bool compressed() const = 0;
};



// A raw file: pread at an offset, so skipping costs nothing and reads nothing.
class RawSource : public ByteSource {
 public:
  RawSource(std::shared_ptr<FileDescriptor> file, std::uint64_t size, std::string name)
      : file_(std::move(file)), size_(size), name_(std::move(name)) {}
  std::size_t read(std::uint8_t* out, std::size_t n) override {
    const std::size_t wanted = static_cast<std::size_t>(std::min<std::uint64_t>(n, size_ - offset_));
    if (out && !pread_fully(file_->fd, out, wanted, offset_, name_))
      throw DataError(name_, "cannot read: the file shrank while it was read");
    offset_ += wanted;
    return wanted;
  }
  bool compressed() const override { return false; }
  // The open file, for IdxItemFile (it takes the descriptor over).
  const std::shared_ptr<FileDescriptor>& file() const { return file_; }

 private:
  std::shared_ptr<FileDescriptor> file_;
  std::uint64_t size_;
  std::uint64_t offset_ = 0;
  std::string name_;
};

// One gzip member inflated as it is read. The file is read in 64 KiB pieces; skipped bytes
// are inflated into a 64 KiB scratch buffer and dropped.
class GzipSource : public ByteSource {
 public:
  GzipSource(std::shared_ptr<FileDescriptor> file, std::uint64_t size, std::string name)
      : file_(std::move(file)), size_(size), name_(std::move(name)), input_(kChunk) {
    if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK)
      throw DataError(name_, "zlib inflateInit2 failed");
  }
  ~GzipSource() override { inflateEnd(&stream_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  std::size_t read(std::uint8_t* out, std::size_t n) override {
    std::size_t done = 0;
    while (done < n && !ended_) {
      std::uint8_t* target = out ? out + done : scratch();
      const std::size_t room = std::min<std::size_t>(out ? n - done : std::min(n - done, kChunk),
                                                     std::numeric_limits<uInt>::max());
      done += inflate_into(target, room);
    }
    return done;
  }
  bool compressed() const override { return true; }

 private:
  static constexpr std::size_t kChunk = std::size_t{1} << 16;

  std::uint8_t* scratch() {
    if (scratch_.empty()) scratch_.resize(kChunk);
    return scratch_.data();
  }

  // Refills the input when it is used up; false at the end of the file.
  bool refill() {
    if (stream_.avail_in > 0) return true;
    if (offset_ == size_) return false;
    const std::size_t wanted = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size_ - offset_));
    ssize_t got;
    do got = ::pread(file_->fd, input_.data(), wanted, static_cast<off_t>(offset_));
    while (got < 0 && errno == EINTR);
    if (got < 0) throw DataError(name_, "cannot read: " + errno_text());
    if (got == 0) return false;
    offset_ += static_cast<std::uint64_t>(got);
    stream_.next_in = input_.data();
    stream_.avail_in = static_cast<uInt>(got);
    return true;
  }

  // Inflates at most `room` bytes into `target`; returns how many came out.
  std::size_t inflate_into(std::uint8_t* target, std::size_t room) {
    if (!refill()) throw DataError(name_, "gzip stream is truncated");
    stream_.next_out = target;
    stream_.avail_out = static_cast<uInt>(room);
    const int status = inflate(&stream_, Z_NO_FLUSH);
    const std::size_t produced = room - stream_.avail_out;
    if (status == Z_STREAM_END) {
      ended_ = true;
      const std::uint64_t rest = stream_.avail_in + (size_ - offset_);
      if (rest != 0)
        throw DataError(name_, std::to_string(rest) + " bytes after the end of the gzip stream");
    } else if (status == Z_BUF_ERROR) {
      throw DataError(name_, "gzip stream is truncated");
    } else if (status != Z_OK) {
      throw DataError(name_,
                      std::string("bad gzip data: ") + (stream_.msg ? stream_.msg : zError(status)));
    }
    return produced;
  }

  std::shared_ptr<FileDescriptor> file_;
  std::uint64_t size_;
  std::uint64_t offset_ = 0;
  std::string name_;
  z_stream stream_{};
  std::vector<std::uint8_t> input_, scratch_;
  bool ended_ = false;
};

}  // namespace

IdxArray parse_idx(std::span<const std::uint8_t> bytes, std::string_view name_view,
                   const IdxLimits& limits) {
  const std::string name(name_view);
  IdxHeader header = check_header(bytes, name, limits);
  const std::size_t actual = bytes.size() - header.header_bytes;
  if (actual < header.payload_bytes) throw truncated_payload(name, header.payload_bytes, actual);
  if (actual > header.payload_bytes)
    throw trailing_payload(name, actual - header.payload_bytes, header.payload_bytes);
  IdxArray array;
  array.dims = std::move(header.dims);
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header.header_bytes), bytes.end());
  return array;
}

IdxArray read_idx_file(const std::filesystem::path& path, const IdxLimits& limits) {
  IdxReader reader(path, limits);
  IdxArray array;
  array.dims = reader.dims();
  array.data = reader.read_all();
  return array;
}

struct IdxReader::State {
  std::string name;
  IdxLimits limits;
  std::unique_ptr<ByteSource> source;
  IdxHeader header;
  std::size_t item_bytes = 0;
  bool read = false;

  // Skips or reads the payload's bytes [from, to) (`out` null: skips); from is where the
  // source stands, relative to the payload's start.
  void take(std::uint8_t* out, std::size_t from, std::size_t to) {
    const std::size_t got = source->read(out, to - from);
    if (got != to - from) throw truncated_payload(name, header.payload_bytes, from + got);
  }

  // After the payload: nothing may follow it.
  void check_end() {
    const std::size_t cap = limits.max_payload_bytes + 4 + 4 * std::size_t{limits.max_dimensions};
    const std::size_t consumed = header.header_bytes + header.payload_bytes;
    const std::size_t extra =
        source->read(nullptr, source->compressed() ? cap - consumed + 1
                                                   : std::numeric_limits<std::size_t>::max());
    if (source->compressed() && consumed + extra > cap)
      throw DataError(name, "decompressed data exceeds the cap of " + std::to_string(cap) + " bytes");
    if (extra > 0) throw trailing_payload(name, extra, header.payload_bytes);
  }

  void start_reading() {
    if (read) throw std::logic_error("IdxReader: " + name + " was read already");
    read = true;
  }
};

IdxReader::IdxReader(const std::filesystem::path& path, const IdxLimits& limits)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.name = path.string();
  s.limits = limits;
  auto file = std::make_shared<FileDescriptor>();
  do file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (file->fd < 0 && errno == EINTR);
  if (file->fd < 0) throw DataError(s.name, "cannot read: " + errno_text());
  struct stat info {};
  if (::fstat(file->fd, &info) != 0) throw DataError(s.name, "cannot read: " + errno_text());
  if (!S_ISREG(info.st_mode)) throw DataError(s.name, "cannot read: not a regular file");
  const auto size = static_cast<std::uint64_t>(info.st_size);
  std::uint8_t magic[2] = {0, 0};
  const bool gzip = size >= 2 && ::pread(file->fd, magic, 2, 0) == 2 && magic[0] == 0x1f &&
                    magic[1] == 0x8b;
  if (gzip)
    s.source = std::make_unique<GzipSource>(std::move(file), size, s.name);
  else
    s.source = std::make_unique<RawSource>(std::move(file), size, s.name);

  // The magic, then as many dimensions as it announces (check_header refuses a count
  // outside the limits before any of them is read).
  std::vector<std::uint8_t> bytes(4);
  bytes.resize(s.source->read(bytes.data(), 4));
  if (bytes.size() == 4 && bytes[3] >= 1 && bytes[3] <= limits.max_dimensions) {
    const std::size_t dims_bytes = 4 * std::size_t{bytes[3]};
    bytes.resize(4 + dims_bytes);
    bytes.resize(4 + s.source->read(bytes.data() + 4, dims_bytes));
  }
  try {
    s.header = check_header(bytes, s.name, limits);
  } catch (const DataError&) {
    // A damaged gzip stream inflates to a header that makes no sense before zlib notices;
    // the damage is the cause worth reporting, as it was when whole files were inflated first.
    if (s.source->compressed())
      s.source->read(nullptr, limits.max_payload_bytes + 4 + 4 * std::size_t{limits.max_dimensions});
    throw;
  }
  s.item_bytes = s.header.payload_bytes / s.header.dims[0];
}

std::shared_ptr<const IdxItemFile> IdxReader::items_in_place() {
  State& s = *state_;
  auto* raw = dynamic_cast<RawSource*>(s.source.get());
  if (!raw) return nullptr;
  s.start_reading();
  s.take(nullptr, 0, s.header.payload_bytes);
  s.check_end();
  const int fd = ::fcntl(raw->file()->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw DataError(s.name, "cannot read: " + errno_text());
  return std::make_shared<IdxItemFile>(fd, s.name, s.header.header_bytes, s.header.dims[0],
                                       s.item_bytes);
}

IdxItemFile::IdxItemFile(int fd, std::string name, std::size_t payload_offset,
                         std::uint32_t count, std::size_t item_bytes)
    : fd_(fd),
      name_(std::move(name)),
      payload_offset_(payload_offset),
      count_(count),
      item_bytes_(item_bytes) {}

IdxItemFile::~IdxItemFile() { ::close(fd_); }

void IdxItemFile::read(std::uint32_t i, std::uint8_t* out) const {
  if (i >= count_)
    throw std::out_of_range("IdxItemFile: item " + std::to_string(i) + " of " + name_ +
                            ", which holds " + std::to_string(count_));
  if (!pread_fully(fd_, out, item_bytes_, payload_offset_ + std::uint64_t{i} * item_bytes_, name_))
    throw DataError(name_, "cannot read item " + std::to_string(i) +
                               ": the file is shorter than when it was checked");
}

IdxReader::~IdxReader() = default;
IdxReader::IdxReader(IdxReader&&) noexcept = default;
IdxReader& IdxReader::operator=(IdxReader&&) noexcept = default;

const std::vector<std::uint32_t>& IdxReader::dims() const { return state_->header.dims; }

std::size_t IdxReader::item_bytes() const { return state_->item_bytes; }

std::vector<std::uint8_t> IdxReader::read_all() {
  State& s = *state_;
  s.start_reading();
  std::vector<std::uint8_t> data(s.header.payload_bytes);
  s.take(data.data(), 0, data.size());
  s.check_end();
  return data;
}

std::vector<std::uint8_t> IdxReader::read_items(std::span<const std::uint32_t> items) {
  State& s = *state_;
  const std::uint32_t count = s.header.dims[0];
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i] >= count)
      throw std::invalid_argument("IdxReader: item " + std::to_string(items[i]) + " of " + s.name +
                                  ", which holds " + std::to_string(count));
    if (i > 0 && items[i] <= items[i - 1])
      throw std::invalid_argument("IdxReader: the items to read must be strictly ascending");
  }
  s.start_reading();
  std::vector<std::uint8_t> data = detail::read_ascending_records(
      items, s.item_bytes, s.header.payload_bytes,
      [&s](std::uint8_t* out, std::uint64_t from, std::uint64_t to) {
        s.take(out, static_cast<std::size_t>(from), static_cast<std::size_t>(to));
      });
  s.check_end();
  return data;
}

}  // namespace edgetrain::runtime
