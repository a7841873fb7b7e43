#include "common/png_image.h"

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace edgetrain::image {
namespace {

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

// A chunk: length, type, data, CRC-32 of type and data (PNG is big-endian).
void put_chunk(std::vector<std::uint8_t>& out, const char* type,
               const std::vector<std::uint8_t>& data) {
  put_u32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t type_at = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc =
      crc32(crc32(0L, Z_NULL, 0), out.data() + type_at, static_cast<uInt>(4 + data.size()));
  put_u32(out, static_cast<std::uint32_t>(crc));
}

}  // namespace

std::vector<std::uint8_t> encode_png_grey(int width, int height,
                                          std::span<const std::uint8_t> pixels) {
  if (width < 1 || height < 1 || pixels.size() != static_cast<std::size_t>(width) * height)
    throw std::invalid_argument("png: " + std::to_string(pixels.size()) + " pixels for " +
                                std::to_string(width) + "x" + std::to_string(height));
  // Scanlines, each after filter byte 0 (none).
  std::vector<std::uint8_t> raw;
  raw.reserve(static_cast<std::size_t>(width + 1) * height);
  for (int y = 0; y < height; y++) {
    raw.push_back(0);
    raw.insert(raw.end(), pixels.begin() + static_cast<std::ptrdiff_t>(y) * width,
               pixels.begin() + static_cast<std::ptrdiff_t>(y + 1) * width);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<std::uint8_t> packed(packed_size);
  if (compress2(packed.data(), &packed_size, raw.data(), static_cast<uLong>(raw.size()), 9) != Z_OK)
    throw std::runtime_error("png: zlib compress2 failed");
  packed.resize(packed_size);

  std::vector<std::uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<std::uint8_t> header;
  put_u32(header, static_cast<std::uint32_t>(width));
  put_u32(header, static_cast<std::uint32_t>(height));
  header.insert(header.end(),
                {8, 0, 0, 0, 0});  // 8 bits, grey, deflate, no filter method, no interlace
  put_chunk(png, "IHDR", header);
  put_chunk(png, "IDAT", packed);
  put_chunk(png, "IEND", {});
  return png;
}

Grid tile_images(std::span<const std::uint8_t> images, int count, int tile, int columns, int gap) {
  if (count < 1 || tile < 1 || columns < 1 || gap < 0 ||
      images.size() < static_cast<std::size_t>(count) * tile * tile)
    throw std::invalid_argument("png grid: not enough pixels for the images asked for");
  const int rows = (count + columns - 1) / columns;
  Grid grid;
  grid.width = columns * tile + (columns + 1) * gap;
  grid.height = rows * tile + (rows + 1) * gap;
  grid.pixels.assign(static_cast<std::size_t>(grid.width) * grid.height, 0);
  for (int i = 0; i < count; i++) {
    const int x0 = gap + (i % columns) * (tile + gap), y0 = gap + (i / columns) * (tile + gap);
    for (int y = 0; y < tile; y++)
      for (int x = 0; x < tile; x++)
        grid.pixels[static_cast<std::size_t>(y0 + y) * grid.width + x0 + x] =
            images[(static_cast<std::size_t>(i) * tile + y) * tile + x];
  }
  return grid;
}

void write_png_grid(const std::string& path, const Grid& grid) {
  const std::vector<std::uint8_t> png = encode_png_grey(grid.width, grid.height, grid.pixels);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
    if (!out.flush()) throw std::runtime_error("cannot write " + temporary);
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace edgetrain::image
