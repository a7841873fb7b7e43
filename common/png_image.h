// Grey-scale PNG files (8 bits per pixel, zlib from Debian), and grids of small images, so a
// person can see what a generator draws without any image library on the machine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace edgetrain::image {

// The PNG file's bytes for `pixels` (height rows of width bytes, 0 black .. 255 white).
// Throws std::invalid_argument for a size that does not match, std::runtime_error if zlib fails.
std::vector<std::uint8_t> encode_png_grey(int width, int height,
                                          std::span<const std::uint8_t> pixels);

// `count` images of tile × tile pixels (back to back) laid out `columns` per row with
// `gap` black pixels between them; returns the grid's pixels and its size.
struct Grid {
  int width = 0, height = 0;
  std::vector<std::uint8_t> pixels;
};
Grid tile_images(std::span<const std::uint8_t> images, int count, int tile, int columns,
                 int gap = 2);

// Writes the grid as a PNG file (through `path`.tmp and a rename).
void write_png_grid(const std::string& path, const Grid& grid);

}  // namespace edgetrain::image
