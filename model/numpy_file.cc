#include "model/numpy_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <limits>
#include <system_error>

#include "model/file_reading.h"

namespace edgetrain::runtime {

namespace {

using detail::errno_text;
using detail::FileDescriptor;
using detail::pread_fully;

// A header larger than this is not a data set's (NumPy pads headers to 64 bytes; version 1
// holds at most 65,535), and a central directory larger than this is not an .npz of a few
// arrays: both caps bound what a damaged file can make us allocate.
constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 16;
constexpr std::uint64_t kMaxCentralDirectoryBytes = std::uint64_t{1} << 24;
constexpr std::size_t kMaxDimensions = 8;
constexpr std::size_t kChunk = std::size_t{1} << 16;




std::uint16_t le16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
std::uint32_t le32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) |
         (std::uint32_t{p[3]} << 24);
}
std::uint64_t le64(const std::uint8_t* p) { return le32(p) | (std::uint64_t{le32(p + 4)} << 32); }

// Where an array's .npy bytes lie in the file: the whole of a .npy file, or an .npz member.
struct Member {
  std::uint64_t offset = 0;        // of its (possibly compressed) bytes
  std::uint64_t stored_bytes = 0;  // in the file
  std::uint64_t bytes = 0;         // once inflated
  bool deflated = false;
  std::uint32_t crc = 0;  // deflated members only: checked as they inflate
};

// Finds member `member_name` of the zip file `fd` (size `size`) through its central directory
// (zip64 too: np.savez writes its members with zip64 local headers).
Member find_zip_member(int fd, std::uint64_t size, const std::string& member_name,
                       const std::string& file) {
  // The end-of-central-directory record: 22 bytes and a comment of up to 65,535, at the end.
  const std::uint64_t tail_size = std::min<std::uint64_t>(size, 22 + 65535);
  std::vector<std::uint8_t> tail(tail_size);
  if (!pread_fully(fd, tail.data(), tail.size(), size - tail_size, file))
    throw DataError(file, "cannot read: the file shrank while it was read");
  std::size_t eocd = std::string::npos;
  for (std::size_t i = tail.size() >= 22 ? tail.size() - 22 + 1 : 0; i-- > 0;)
    if (le32(&tail[i]) == 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd == std::string::npos)
    throw DataError(file,
                    "not a complete .npz (zip) file: no end of central directory; "
                    "truncated?");
  std::uint64_t entries = le16(&tail[eocd + 10]);
  std::uint64_t directory_bytes = le32(&tail[eocd + 12]);
  std::uint64_t directory_offset = le32(&tail[eocd + 16]);
  if (entries == 0xffff || directory_bytes == 0xffffffff || directory_offset == 0xffffffff) {
    // Zip64: a locator just before the record points to the zip64 record.
    if (eocd < 20 || le32(&tail[eocd - 20]) != 0x07064b50)
      throw DataError(file, "damaged .npz (zip) file: zip64 locator missing");
    const std::uint64_t record = le64(&tail[eocd - 20 + 8]);
    std::uint8_t z[56];
    if (record > size || size - record < sizeof z || !pread_fully(fd, z, sizeof z, record, file) ||
        le32(z) != 0x06064b50)
      throw DataError(file, "damaged .npz (zip) file: bad zip64 end of central directory");
    entries = le64(z + 32);
    directory_bytes = le64(z + 40);
    directory_offset = le64(z + 48);
  }
  if (directory_offset > size || directory_bytes > size - directory_offset)
    throw DataError(file, "damaged .npz (zip) file: central directory beyond the end; truncated?");
  if (directory_bytes > kMaxCentralDirectoryBytes)
    throw DataError(file, "central directory of " + std::to_string(directory_bytes) +
                              " bytes: not an .npz of a data set");
  std::vector<std::uint8_t> directory(directory_bytes);
  if (!pread_fully(fd, directory.data(), directory.size(), directory_offset, file))
    throw DataError(file, "cannot read: the file shrank while it was read");

  std::vector<std::string> names;
  std::size_t at = 0;
  for (std::uint64_t e = 0; e < entries; ++e) {
    if (directory.size() - at < 46 || le32(&directory[at]) != 0x02014b50)
      throw DataError(file,
                      "damaged .npz (zip) file: bad central directory entry " + std::to_string(e));
    const std::uint8_t* entry = &directory[at];
    const std::size_t name_length = le16(entry + 28), extra_length = le16(entry + 30),
                      comment_length = le16(entry + 32);
    if (directory.size() - at - 46 < name_length + extra_length + comment_length)
      throw DataError(file, "damaged .npz (zip) file: central directory entry " +
                                std::to_string(e) + " runs past its end");
    const std::string name(reinterpret_cast<const char*>(entry + 46), name_length);
    names.push_back(name);
    if (name == member_name) {
      const std::uint16_t flags = le16(entry + 8), method = le16(entry + 10);
      Member m;
      m.crc = le32(entry + 16);
      m.stored_bytes = le32(entry + 20);
      m.bytes = le32(entry + 24);
      std::uint64_t local = le32(entry + 42);
      // Fields that do not fit 32 bits are in the zip64 extra field, in this order.
      const std::uint8_t* extra = entry + 46 + name_length;
      for (std::size_t x = 0; x + 4 <= extra_length;) {
        const std::uint16_t id = le16(extra + x), length = le16(extra + x + 2);
        if (x + 4 + length > extra_length) break;
        if (id == 0x0001) {
          const std::uint8_t* field = extra + x + 4;
          std::size_t used = 0;
          auto take = [&](std::uint64_t& value) {
            if (value != 0xffffffff) return;
            if (used + 8 > length)
              throw DataError(file, "damaged .npz (zip) file: short zip64 field of " + name);
            value = le64(field + used);
            used += 8;
          };
          take(m.bytes);
          take(m.stored_bytes);
          take(local);
        }
        x += 4 + std::size_t{length};
      }
      if (flags & 1) throw DataError(file, "member " + name + " is encrypted");
      if (method != 0 && method != 8)
        throw DataError(file, "member " + name + " uses zip compression method " +
                                  std::to_string(method) +
                                  "; only stored (np.savez) and deflated "
                                  "(np.savez_compressed) members are read");
      m.deflated = method == 8;
      if (!m.deflated && m.stored_bytes != m.bytes)
        throw DataError(file, "damaged .npz (zip) file: stored member " + name +
                                  " has different stored and real sizes");
      std::uint8_t header[30];
      if (local > size || size - local < sizeof header ||
          !pread_fully(fd, header, sizeof header, local, file) || le32(header) != 0x04034b50)
        throw DataError(file, "damaged .npz (zip) file: bad local header of " + name);
      m.offset = local + 30 + le16(header + 26) + le16(header + 28);
      if (m.offset > size || m.stored_bytes > size - m.offset)
        throw DataError(
            file, "member " + name + " is truncated: " + std::to_string(m.stored_bytes) +
                      " bytes announced, " + std::to_string(m.offset > size ? 0 : size - m.offset) +
                      " in the file");
      return m;
    }
    at += 46 + name_length + extra_length + comment_length;
  }
  std::string list;
  for (const std::string& n : names) {
    std::string shown = n.size() > 4 && n.ends_with(".npy") ? n.substr(0, n.size() - 4) : n;
    list += (list.empty() ? "" : ", ") + shown;
  }
  throw DataError(file, "has no array " + member_name.substr(0, member_name.size() - 4) +
                            " (arrays: " + (list.empty() ? "none" : list) + ")");
}

// A member's bytes front to back (inflated when deflated).
class MemberSource {
 public:
  MemberSource(std::shared_ptr<FileDescriptor> file, Member member, std::string name)
      : file_(std::move(file)), member_(member), name_(std::move(name)) {
    if (member_.deflated) {
      if (inflateInit2(&stream_, -MAX_WBITS) != Z_OK)
        throw DataError(name_, "zlib inflateInit2 failed");
      inflating_ = true;
      input_.resize(kChunk);
    }
  }
  ~MemberSource() {
    if (inflating_) inflateEnd(&stream_);
  }
  MemberSource(const MemberSource&) = delete;
  MemberSource& operator=(const MemberSource&) = delete;

  bool deflated() const { return member_.deflated; }
  const Member& member() const { return member_; }
  const std::shared_ptr<FileDescriptor>& file() const { return file_; }

  // Copies the next n bytes to `out` (null: skips them); fewer only at the member's end.
  std::size_t read(std::uint8_t* out, std::size_t n) {
    if (!member_.deflated) {
      const std::size_t wanted =
          static_cast<std::size_t>(std::min<std::uint64_t>(n, member_.bytes - position_));
      if (out && !pread_fully(file_->fd, out, wanted, member_.offset + position_, name_))
        throw DataError(name_, "cannot read: the file shrank while it was read");
      position_ += wanted;
      return wanted;
    }
    std::size_t done = 0;
    while (done < n && !ended_) {
      std::uint8_t* target = out ? out + done : scratch();
      const std::size_t room = std::min<std::size_t>(out ? n - done : std::min(n - done, kChunk),
                                                     std::numeric_limits<uInt>::max());
      done += inflate_into(target, room);
    }
    return done;
  }

  // After the last byte read: a deflated member must end exactly there, with its CRC.
  void check_end() {
    if (!member_.deflated) return;
    if (!ended_) {
      std::uint8_t byte;
      if (read(&byte, 1) == 1 || !ended_)
        throw DataError(name_, "deflated member inflates past the " +
                                   std::to_string(member_.bytes) + " bytes its zip entry says");
    }
    if (position_ != member_.bytes)
      throw DataError(name_, "deflated member inflates to " + std::to_string(position_) +
                                 " bytes, its zip entry says " + std::to_string(member_.bytes));
    if (crc_ != member_.crc) throw DataError(name_, "deflated member fails its CRC-32 check");
  }

 private:
  std::uint8_t* scratch() {
    if (scratch_.empty()) scratch_.resize(kChunk);
    return scratch_.data();
  }

  std::size_t inflate_into(std::uint8_t* target, std::size_t room) {
    if (stream_.avail_in == 0) {
      const std::uint64_t left = member_.stored_bytes - consumed_;
      if (left == 0) throw DataError(name_, "deflated member is truncated");
      const std::size_t wanted = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, left));
      if (!pread_fully(file_->fd, input_.data(), wanted, member_.offset + consumed_, name_))
        throw DataError(name_, "cannot read: the file shrank while it was read");
      consumed_ += wanted;
      stream_.next_in = input_.data();
      stream_.avail_in = static_cast<uInt>(wanted);
    }
    stream_.next_out = target;
    stream_.avail_out = static_cast<uInt>(room);
    const int status = inflate(&stream_, Z_NO_FLUSH);
    const std::size_t produced = room - stream_.avail_out;
    crc_ = static_cast<std::uint32_t>(crc32(crc_, target, static_cast<uInt>(produced)));
    position_ += produced;
    if (status == Z_STREAM_END) {
      ended_ = true;
    } else if (status == Z_BUF_ERROR) {
      throw DataError(name_, "deflated member is truncated");
    } else if (status != Z_OK) {
      throw DataError(
          name_, std::string("bad deflate data: ") + (stream_.msg ? stream_.msg : zError(status)));
    }
    return produced;
  }

  std::shared_ptr<FileDescriptor> file_;
  Member member_;
  std::string name_;
  std::uint64_t position_ = 0;  // bytes of the member read or skipped (inflated)
  // Deflated members only.
  bool inflating_ = false;
  z_stream stream_{};
  std::vector<std::uint8_t> input_, scratch_;
  std::uint64_t consumed_ = 0;
  std::uint32_t crc_ = 0;
  bool ended_ = false;
};

// The header's Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False,
// 'shape': (100, 8, 8, 1), }: just the syntax NumPy writes (strings, True/False, tuples of
// integers), refused otherwise.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  NpyHeader parse() {
    bool have_descr = false, have_order = false, have_shape = false;
    NpyHeader header;
    expect('{');
    while (!peek('}')) {
      const std::string key = string();
      expect(':');
      if (key == "descr") {
        if (peek('['))
          fail(
              "a structured dtype (a record of named fields) is not supported; save one "
              "plain numeric array per file or per .npz name");
        header.descr = string();
        have_descr = true;
      } else if (key == "fortran_order") {
        const std::string word = identifier();
        if (word == "True")
          throw DataError(name_,
                          "array is in Fortran (column-major) order; save it in C order "
                          "(np.ascontiguousarray(x))");
        if (word != "False") fail("fortran_order is " + word);
        have_order = true;
      } else if (key == "shape") {
        expect('(');
        while (!peek(')')) {
          header.shape.push_back(integer());
          if (header.shape.size() > kMaxDimensions)
            throw DataError(
                name_, "array has more than " + std::to_string(kMaxDimensions) + " dimensions");
          if (!peek(')')) expect(',');
        }
        expect(')');
        have_shape = true;
      } else {
        fail("unknown key '" + key + "'");
      }
      if (!peek('}')) expect(',');
    }
    expect('}');
    if (!have_descr || !have_order || !have_shape) fail("descr, fortran_order or shape missing");
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw DataError(name_, "bad .npy header (" + why + ")");
  }
  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  bool peek(char c) {
    skip_space();
    return at_ < text_.size() && text_[at_] == c;
  }
  void expect(char c) {
    if (!peek(c)) fail(std::string("expected '") + c + "' at byte " + std::to_string(at_));
    ++at_;
  }
  std::string string() {
    skip_space();
    if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"'))
      fail("expected a string at byte " + std::to_string(at_));
    const char quote = text_[at_++];
    const std::size_t end = text_.find(quote, at_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string value(text_.substr(at_, end - at_));
    at_ = end + 1;
    return value;
  }
  std::string identifier() {
    skip_space();
    const std::size_t start = at_;
    while (at_ < text_.size() && std::isalpha(static_cast<unsigned char>(text_[at_]))) ++at_;
    return std::string(text_.substr(start, at_ - start));
  }
  std::uint64_t integer() {
    skip_space();
    if (at_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[at_])))
      fail("expected a dimension at byte " + std::to_string(at_));
    std::uint64_t value = 0;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) {
      const std::uint64_t digit = static_cast<std::uint64_t>(text_[at_++] - '0');
      if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
        fail("dimension too large");
      value = value * 10 + digit;
    }
    if (at_ < text_.size() && text_[at_] == 'L') ++at_;  // Python 2's long suffix
    return value;
  }

  std::string_view text_;
  const std::string& name_;
  std::size_t at_ = 0;
};

// Checks the dtype: little-endian (or one byte), a plain number.
void check_descr(NpyHeader& header, const std::string& name) {
  const std::string& d = header.descr;
  if (d.size() < 3 || (d[0] != '<' && d[0] != '>' && d[0] != '|' && d[0] != '='))
    throw DataError(name, "dtype '" + d + "' is not supported");
  header.kind = d[1];
  std::size_t bytes = 0;
  for (std::size_t i = 2; i < d.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(d[i])) || bytes > 64)
      throw DataError(name, "dtype '" + d + "' is not supported");
    bytes = bytes * 10 + static_cast<std::size_t>(d[i] - '0');
  }
  if (header.kind == 'O')
    throw DataError(name,
                    "an object array (pickled Python objects) is not supported; save a "
                    "numeric array");
  if (std::string("fiub").find(header.kind) == std::string::npos || bytes == 0 || bytes > 8)
    throw DataError(name, "dtype '" + d +
                              "' is not supported (features: float32 or uint8; "
                              "labels: integers)");
  if (d[0] == '>' && bytes > 1)
    throw DataError(name, "dtype '" + d +
                              "' is big-endian; save it little-endian "
                              "(x.astype(x.dtype.newbyteorder('<')))");
  header.item_bytes = bytes;
}

}  // namespace

std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

struct NpyReader::State {
  std::string name;
  std::unique_ptr<MemberSource> source;
  NpyHeader header;
  std::uint64_t header_bytes = 0;   // of the member: magic, lengths, the dict
  std::uint64_t payload_bytes = 0;  // rows * row_bytes
  std::size_t row_bytes = 0;
  bool read = false;

  void start_reading() {
    if (read) throw std::logic_error("NpyReader: " + name + " was read already");
    read = true;
  }
  void take(std::uint8_t* out, std::uint64_t from, std::uint64_t to) {
    const std::size_t n = static_cast<std::size_t>(to - from);
    const std::size_t got = source->read(out, n);
    if (got != n)
      throw DataError(name, "truncated: the array ends after " + std::to_string(from + got) +
                                " of the " + std::to_string(payload_bytes) +
                                " data bytes its header announces");
  }
};

NpyReader::NpyReader(const std::filesystem::path& path, const std::string& array)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  const std::string file = path.string();
  s.name = array.empty() ? file : file + ":" + array;
  auto fd = std::make_shared<FileDescriptor>();
  do fd->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (fd->fd < 0 && errno == EINTR);
  if (fd->fd < 0) throw DataError(file, "cannot read: " + errno_text());
  struct stat info {};
  if (::fstat(fd->fd, &info) != 0) throw DataError(file, "cannot read: " + errno_text());
  if (!S_ISREG(info.st_mode)) throw DataError(file, "cannot read: not a regular file");
  const auto size = static_cast<std::uint64_t>(info.st_size);
  std::uint8_t magic[4] = {0, 0, 0, 0};
  const bool zip = size >= 4 && pread_fully(fd->fd, magic, 4, 0, file) && le32(magic) == 0x04034b50;
  Member member;
  if (zip) {
    if (array.empty())
      throw DataError(file,
                      "is an .npz archive: name the array in it (features_array, "
                      "labels_array)");
    member = find_zip_member(fd->fd, size, array + ".npy", file);
  } else {
    if (!array.empty())
      throw DataError(file,
                      "is not an .npz archive, but an array in it was asked for (" + array + ")");
    member.bytes = member.stored_bytes = size;
  }
  s.source = std::make_unique<MemberSource>(std::move(fd), member, s.name);

  std::uint8_t prefix[12];
  const std::size_t got = s.source->read(prefix, 10);
  static constexpr std::uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (got < 10 || !std::equal(kMagic, kMagic + 6, prefix))
    throw DataError(s.name, got == 0 ? "file is empty" : "not a .npy array (no \\x93NUMPY magic)");
  const std::uint8_t major = prefix[6];
  std::size_t text_bytes;
  if (major == 1) {
    text_bytes = le16(prefix + 8);
    s.header_bytes = 10;
  } else if (major == 2 || major == 3) {
    if (s.source->read(prefix + 10, 2) != 2) throw DataError(s.name, "truncated .npy header");
    text_bytes = le32(prefix + 8);
    s.header_bytes = 12;
  } else {
    throw DataError(s.name, ".npy format version " + std::to_string(major) + " is not supported");
  }
  if (text_bytes > kMaxHeaderBytes)
    throw DataError(s.name, ".npy header of " + std::to_string(text_bytes) + " bytes is too long");
  std::string text(text_bytes, '\0');
  if (s.source->read(reinterpret_cast<std::uint8_t*>(text.data()), text_bytes) != text_bytes)
    throw DataError(s.name, "truncated .npy header");
  s.header_bytes += text_bytes;
  s.header = HeaderParser(text, s.name).parse();
  check_descr(s.header, s.name);
  if (s.header.shape.empty())
    throw DataError(s.name,
                    "array has no dimensions (a single value); expected one row per example");
  std::uint64_t row = s.header.item_bytes;
  for (std::size_t d = 1; d < s.header.shape.size(); ++d)
    if (__builtin_mul_overflow(row, s.header.shape[d], &row))
      throw DataError(s.name, "shape " + shape_text(s.header.shape) + " overflows");
  if (row > std::numeric_limits<std::uint32_t>::max())
    throw DataError(s.name, "rows of " + std::to_string(row) + " bytes are too large");
  s.row_bytes = static_cast<std::size_t>(row);
  if (__builtin_mul_overflow(row, s.header.shape[0], &s.payload_bytes))
    throw DataError(s.name, "shape " + shape_text(s.header.shape) + " overflows");
  const std::uint64_t actual = member.bytes - std::min(member.bytes, s.header_bytes);
  if (actual < s.payload_bytes)
    throw DataError(s.name, "truncated: shape " + shape_text(s.header.shape) + " of " +
                                s.header.descr + " needs " + std::to_string(s.payload_bytes) +
                                " data bytes, the array has " + std::to_string(actual));
  if (actual > s.payload_bytes)
    throw DataError(s.name, std::to_string(actual - s.payload_bytes) + " bytes after the " +
                                std::to_string(s.payload_bytes) + " data bytes of shape " +
                                shape_text(s.header.shape));
}

NpyReader::~NpyReader() = default;
NpyReader::NpyReader(NpyReader&&) noexcept = default;
NpyReader& NpyReader::operator=(NpyReader&&) noexcept = default;

const std::string& NpyReader::name() const { return state_->name; }
const NpyHeader& NpyReader::header() const { return state_->header; }
std::uint64_t NpyReader::rows() const { return state_->header.shape[0]; }
std::size_t NpyReader::row_bytes() const { return state_->row_bytes; }

std::vector<std::uint8_t> NpyReader::read_all() {
  State& s = *state_;
  s.start_reading();
  std::vector<std::uint8_t> data(static_cast<std::size_t>(s.payload_bytes));
  s.take(data.data(), 0, s.payload_bytes);
  s.source->check_end();
  return data;
}

std::vector<std::uint8_t> NpyReader::read_rows(std::span<const std::uint32_t> rows) {
  State& s = *state_;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= this->rows())
      throw std::invalid_argument("NpyReader: row " + std::to_string(rows[i]) + " of " + s.name +
                                  ", which has " + std::to_string(this->rows()));
    if (i > 0 && rows[i] <= rows[i - 1])
      throw std::invalid_argument("NpyReader: the rows to read must be strictly ascending");
  }
  s.start_reading();
  std::vector<std::uint8_t> data = detail::read_ascending_records(
      rows, s.row_bytes, s.payload_bytes,
      [&s](std::uint8_t* out, std::uint64_t from, std::uint64_t to) { s.take(out, from, to); });
  s.source->check_end();
  return data;
}

std::shared_ptr<const IdxItemFile> NpyReader::rows_in_place() {
  State& s = *state_;
  if (s.source->deflated()) return nullptr;
  s.start_reading();
  if (rows() > std::numeric_limits<std::uint32_t>::max())
    throw DataError(s.name, "more than 2^32 rows");
  const int fd = ::fcntl(s.source->file()->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw DataError(s.name, "cannot read: " + errno_text());
  // The length was checked against the header at construction; IdxItemFile reads any
  // fixed-size items at an offset, whatever the file's format.
  return std::make_shared<IdxItemFile>(fd, s.name, s.source->member().offset + s.header_bytes,
                                       static_cast<std::uint32_t>(rows()), s.row_bytes);
}

}  // namespace edgetrain::runtime
