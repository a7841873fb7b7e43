// common/png_image.h: the PNG bytes decode back to the pixels (signature, IHDR, chunk CRCs,
// zlib stream of filter-0 scanlines), grids place each image at its cell, bad sizes are refused.
#include "common/png_image.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <stdexcept>
#include <vector>

namespace {

std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         p[3];
}

TEST(PngImage, DecodesBackToThePixels) {
  const int width = 5, height = 3;
  std::vector<std::uint8_t> pixels(width * height);
  for (std::size_t i = 0; i < pixels.size(); i++) pixels[i] = static_cast<std::uint8_t>(i * 17);
  const auto png = edgetrain::image::encode_png_grey(width, height, pixels);
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(std::vector<std::uint8_t>(png.begin(), png.begin() + 8),
            (std::vector<std::uint8_t>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}));
  std::vector<std::uint8_t> idat;
  std::size_t at = 8;
  int chunks = 0;
  while (at + 12 <= png.size()) {
    const std::uint32_t length = be32(&png[at]);
    const std::string type(png.begin() + at + 4, png.begin() + at + 8);
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), &png[at + 4], 4 + length);
    EXPECT_EQ(be32(&png[at + 8 + length]), crc) << type;
    if (type == "IHDR") {
      EXPECT_EQ(be32(&png[at + 8]), static_cast<std::uint32_t>(width));
      EXPECT_EQ(be32(&png[at + 12]), static_cast<std::uint32_t>(height));
      EXPECT_EQ(png[at + 16], 8);  // bit depth
      EXPECT_EQ(png[at + 17], 0);  // grey
    }
    if (type == "IDAT")
      idat.insert(idat.end(), png.begin() + at + 8, png.begin() + at + 8 + length);
    at += 12 + length;
    ++chunks;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ(chunks, 3);
  std::vector<std::uint8_t> raw((width + 1) * height);
  uLongf raw_size = raw.size();
  ASSERT_EQ(uncompress(raw.data(), &raw_size, idat.data(), idat.size()), Z_OK);
  ASSERT_EQ(raw_size, raw.size());
  for (int y = 0; y < height; y++) {
    EXPECT_EQ(raw[y * (width + 1)], 0) << "filter byte of row " << y;
    for (int x = 0; x < width; x++) EXPECT_EQ(raw[y * (width + 1) + 1 + x], pixels[y * width + x]);
  }
}

TEST(PngImage, GridPlacesEachImageInItsCell) {
  // Three 2x2 images valued 10, 20, 30, two per row, gap 1: 7 wide, 7 high.
  std::vector<std::uint8_t> images(12);
  for (int i = 0; i < 3; i++)
    std::fill(images.begin() + 4 * i, images.begin() + 4 * (i + 1), 10 * (i + 1));
  const auto grid = edgetrain::image::tile_images(images, 3, 2, 2, 1);
  ASSERT_EQ(grid.width, 7);
  ASSERT_EQ(grid.height, 7);
  EXPECT_EQ(grid.pixels[1 * 7 + 1], 10);
  EXPECT_EQ(grid.pixels[2 * 7 + 5], 20);
  EXPECT_EQ(grid.pixels[4 * 7 + 1], 30);
  EXPECT_EQ(grid.pixels[4 * 7 + 4], 0) << "the empty fourth cell";
  EXPECT_EQ(grid.pixels[0], 0) << "the gap";
}

TEST(PngImage, RefusesSizesThatDoNotMatch) {
  EXPECT_THROW(edgetrain::image::encode_png_grey(4, 4, std::vector<std::uint8_t>(15)),
               std::invalid_argument);
  EXPECT_THROW(edgetrain::image::encode_png_grey(0, 4, {}), std::invalid_argument);
  EXPECT_THROW(edgetrain::image::tile_images(std::vector<std::uint8_t>(10), 3, 2, 2),
               std::invalid_argument);
}

}  // namespace
