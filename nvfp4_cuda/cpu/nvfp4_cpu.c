/* nvfp4_cpu.c -- optional native CPU fast path for the NVFP4 reference (block amax, encode, decode).
 *
 * Same float32 operations, in the same order, as nvfp4_cuda/reference.py and csrc/nvfp4_common.cuh
 * (compiled with -ffp-contract=off so nothing is fused); tests check bit-identity with the
 * pure-PyTorch reference.  Single-threaded, two passes over the input (block amax, then encode).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mxfp8.h" /* mxfp8_codec's: MXFP8 constants, scale rule, counter RNG, grid-rounding block encoder */

#define FLT_MAX_F 3.402823466e+38f
#define ONE_SIXTH 0.16666667163372040f

/* max/min without libm calls (fmaxf/fminf are not inlined without -ffinite-math-only); NaN is checked apart */
static inline float max_f(float a, float b) { return a > b ? a : b; }
static inline float min_f(float a, float b) { return a < b ? a : b; }

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint32_t rand24(uint64_t i, uint32_t k2, uint32_t k3) { return mx_rng_word(i, k2, k3) >> (32 - MX_SR_BITS); }

static inline float e4m3_round(float a) { /* a >= 0, RNE, saturating: the NVFP4 block scale's E4M3 value */
  const uint32_t code = mx_e4m3_grid_code(a, 0, 0u);
  return mx_e4m3_value(code);
}

static inline uint32_t e4m3_bits(float q) { return mx_e4m3_grid_code(q, 0, 0u); } /* q >= 0 on the grid */

static const float kInvU[3] = {2.0f, 1.0f, 0.5f};

/* Branch-free on purpose: random data would mispredict every data-dependent branch. */
static inline uint32_t e2m1_encode(float v, int sr, uint32_t r24) {
  float a = fabsf(v);
  int region = (a >= 2.0f) + (a >= 4.0f);
  float n = mx_round_grid(a * kInvU[region], sr, r24);
  n = min_f(n, 8.0f);
  int code = (int)n + 2 * region;
  code = code < 7 ? code : 7;
  return (uint32_t)code | ((f2u(v) >> 28) & 8u);
}

/* Block amax of |x| for 1x16 blocks (and the global amax); returns the flat index of the first non-finite
   element or -1.  With block_2d, each 16x16 tile's max is then written to all 16 rows of the tile. */
int64_t nvfp4_cpu_block_amax(const float *x, int64_t rows, int64_t cols, int block_2d, float *bam, float *amax) {
  const int64_t nbc = cols / 16, nb = rows * nbc;
  float g = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const float *p = x + b * 16;
    float m = 0.0f;
    int bad = 0;
    for (int i = 0; i < 16; ++i) {
      const float a = fabsf(p[i]);
      bad |= !(a <= FLT_MAX_F); /* inf or NaN */
      m = max_f(m, a);
    }
    if (bad) {
      for (int i = 0; i < 16; ++i)
        if (!(fabsf(p[i]) <= FLT_MAX_F)) return b * 16 + i;
    }
    bam[b] = m;
    g = max_f(g, m);
  }
  *amax = g;
  if (block_2d) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      const int64_t r1 = r0 + 16 < rows ? r0 + 16 : rows;
      for (int64_t c = 0; c < nbc; ++c) {
        float t = 0.0f;
        for (int64_t r = r0; r < r1; ++r) t = max_f(t, bam[r * nbc + c]);
        for (int64_t r = r0; r < r1; ++r) bam[r * nbc + c] = t;
      }
    }
  }
  return -1;
}

/* Scales and packed codes from block amax (already tile-reduced for 2-D blocks) and S_enc / S_dec. */
void nvfp4_cpu_encode(const float *x, int64_t rows, int64_t cols, const float *bam, float s_enc, float s_dec, int sr,
                      uint32_t k2, uint32_t k3, uint8_t *codes, uint8_t *scales) {
  const int64_t nb = rows * (cols / 16);
  const float s6 = s_enc * ONE_SIXTH;
  for (int64_t b = 0; b < nb; ++b) {
    float sf_f = bam[b] * s6;
    sf_f = sf_f < 448.0f ? sf_f : 448.0f;
    float sf = e4m3_round(sf_f);
    float enc = 1.0f / (sf * s_dec);
    enc = enc < FLT_MAX_F ? enc : FLT_MAX_F;
    scales[b] = (uint8_t)e4m3_bits(sf);
    const float *p = x + b * 16;
    uint8_t *o = codes + b * 8;
    for (int j = 0; j < 8; ++j) {
      uint64_t i0 = (uint64_t)(b * 16 + 2 * j);
      uint32_t lo = e2m1_encode(p[2 * j] * enc, sr, sr ? rand24(i0, k2, k3) : 0u);
      uint32_t hi = e2m1_encode(p[2 * j + 1] * enc, sr, sr ? rand24(i0 + 1, k2, k3) : 0u);
      o[j] = (uint8_t)(lo | (hi << 4));
    }
  }
}

/* out[r, c] = e2m1(code) * e4m3(scale) (no tensor scale), float32. */
void nvfp4_cpu_decode(const uint8_t *codes, const uint8_t *scales, const float *e4m3_table, int64_t rows,
                      int64_t cols, float *out) {
  static const float v16[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int64_t nb = rows * (cols / 16);
  for (int64_t b = 0; b < nb; ++b) {
    const float sf = e4m3_table[scales[b]];
    const uint8_t *p = codes + b * 8;
    float *o = out + b * 16;
    for (int j = 0; j < 8; ++j) {
      o[2 * j] = v16[p[j] & 0xF] * sf;
      o[2 * j + 1] = v16[p[j] >> 4] * sf;
    }
  }
}

/* 16-point random Hadamard transform of n_groups consecutive 16-element groups (reference butterfly order). */
void nvfp4_cpu_hadamard16(const float *x, int64_t n_groups, float *out) {
  static const float s[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    float y[16];
    for (int i = 0; i < 16; ++i) y[i] = x[gi * 16 + i] * s[i];
    for (int h = 1; h < 16; h *= 2)
      for (int g = 0; g < 16; g += 2 * h)
        for (int j = g; j < g + h; ++j) {
          float a = y[j], b = y[j + h];
          y[j] = a + b;
          y[j + h] = a - b;
        }
    for (int i = 0; i < 16; ++i) out[gi * 16 + i] = y[i] * 0.25f;
  }
}

/* ---- MXFP8 master (reference_master.py): the format's rules are mxfp8.h's ------------------------------ */

static inline float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16_rne(float f) {
  uint32_t b = f2u(f);
  if (f != f) return (uint16_t)0x7FC0;  /* torch's canonical NaN */
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/* Fused Lion step; writeback 0 stochastic, 1 rne, 2 compensated.  Returns -1 on success; -2 - i when grad[i] is
   non-finite (nothing written); or the flat index of the first element of a block whose updated weight is
   non-finite (a corrupt master / compensation buffer; blocks before it are already updated). */
int64_t nvfp4_cpu_lion(uint8_t *payload, uint8_t *scales, const float *grad, uint16_t *momentum, float *comp,
                       int64_t rows, int64_t cols, float neg_lr, float decay, float b1, float omb1, float b2,
                       float omb2, int writeback, uint32_t k2, uint32_t k3) {
  const int64_t nb = (cols + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;
  float v[MX_BLOCK_SIZE];
  for (int64_t i = 0; i < rows * cols; ++i) /* reject a non-finite gradient before touching anything */
    if (!(fabsf(grad[i]) <= FLT_MAX_F)) return -2 - i;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t base = r * cols + j * MX_BLOCK_SIZE;
      const int len = (int)(cols - j * MX_BLOCK_SIZE < MX_BLOCK_SIZE ? cols - j * MX_BLOCK_SIZE : MX_BLOCK_SIZE);
      const float sdec = mx_e8m0_value(scales[r * nb + j]);
      for (int i = 0; i < len; ++i) {
        const int64_t idx = base + i;
        float w = mx_e4m3_value(payload[idx]) * sdec;
        const float g = grad[idx], m = bf16_to_f32(momentum[idx]);
        const float c = (m * b1) + (g * omb1);
        const float upd = c > 0.0f ? neg_lr : (c < 0.0f ? -neg_lr : 0.0f);
        if (writeback == 2) w = w + comp[idx];
        v[i] = (w * decay) + upd;
        if (!(fabsf(v[i]) <= FLT_MAX_F)) return base;
      }
      for (int i = 0; i < len; ++i) {
        const int64_t idx = base + i;
        momentum[idx] = f32_to_bf16_rne((bf16_to_f32(momentum[idx]) * b2) + (grad[idx] * omb2));
      }
      mx_encode_block_grid(v, len, (uint64_t)base, writeback == 0, 1, k2, k3, payload + base, scales + r * nb + j);
      if (writeback == 2) {
        const float snew = mx_e8m0_value(scales[r * nb + j]);
        for (int i = 0; i < len; ++i) comp[base + i] = v[i] - mx_e4m3_value(payload[base + i]) * snew;
      }
    }
  return -1;
}

/* float32 -> bfloat16 stochastic rounding (16 random bits added to the dropped half). */
void nvfp4_cpu_sr_bf16(const float *src, int64_t n, uint32_t k2, uint32_t k3, uint16_t *dst) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b = f2u(src[i]);
    float a = fabsf(src[i]);
    if (a <= FLT_MAX_F) {
      uint32_t r16 = mx_rng_word((uint64_t)i, k2, k3) >> 16;
      dst[i] = (uint16_t)((b + r16) >> 16);
    } else {
      dst[i] = (uint16_t)((b >> 16) | (src[i] != src[i] ? 0x40u : 0u));
    }
  }
}
