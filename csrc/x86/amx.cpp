// AMX-INT8 variant: the W8A8 INT8 linear on TDPBUSD tiles for prefill-sized M, VPDPBUSD below
// that (needs amx_tile + amx_int8 and avx512 vnni; Sapphire Rapids and later).
//
// One layout serves both paths: the VNNI panels of vnni_micro.h with K padded to 64, since a
// panel's 16 consecutive 4-K groups (1 KB, row stride 64) are exactly an AMX B tile (16 rows of
// 16 columns x 4 K). Activations are the same u8 = q + 128 rows (TDPBUSD is unsigned x signed
// as well) with the same column-sum correction, rows padded to 32 for whole A tiles.
#include <sys/syscall.h>
#include <unistd.h>

#include "vnni_micro.h"

namespace anycore {
namespace {

using AmxLayoutMicro = VnniMicroT<64, 32>;
constexpr int64_t kAmxMinRows = 32;  // below this the VNNI micro-kernel is as fast (decode, tiny M)

// Linux grants AMX tile state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM).
int g_amx_state = 0;  // 0 unknown, 1 granted, -1 refused
bool amx_permitted() {
  int s = __atomic_load_n(&g_amx_state, __ATOMIC_RELAXED);
  if (s == 0) {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    s = syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0 ? 1 : -1;
    __atomic_store_n(&g_amx_state, s, __ATOMIC_RELAXED);
  }
  return s > 0;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// 32 rows x 32 columns per step: C tiles 0-3, A tiles 4-5 (16 rows x 64 K), B tiles 6-7
// (one panel's 64 K each). `panels` = 1 leaves tiles 1 and 3 unused (the last odd panel).
void amx_block(const int8_t* a, int64_t kp, const int8_t* w, int64_t ps, int panels, int32_t* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < kp; kb += 64) {
    _tile_loadd(4, a + kb, kp);
    _tile_loadd(5, a + 16 * kp + kb, kp);
    _tile_loadd(6, w + kb * kI8Panel, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(2, 5, 6);
    if (panels > 1) {
      _tile_loadd(7, w + ps + kb * kI8Panel, 64);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(3, 5, 7);
    }
  }
  constexpr int64_t ldc = 32 * 4;  // bytes per row of the 32 x 32 int32 block
  _tile_stored(0, c, ldc);
  _tile_stored(2, c + 16 * 32, ldc);
  if (panels > 1) {
    _tile_stored(1, c + 16, ldc);
    _tile_stored(3, c + 16 * 32 + 16, ldc);
  }
}

void amx_gemm(const W8A8Args& a) {
  using L = I8Layout<AmxLayoutMicro>;
  const int64_t m = a.m, n = a.n, kp = L::kp(a.k);
  const int8_t* act = static_cast<const int8_t*>(a.workspace);
  const float* xs = i8_row_scales<AmxLayoutMicro>(a);
  const int8_t* w = static_cast<const int8_t*>(a.w);
  const int32_t* colsum = reinterpret_cast<const int32_t*>(w + L::weight_bytes(n, a.k));
  constexpr int64_t MB = 32, NB = 32;
  const I8Work wk = i8_work(m, n, kp, MB, NB);
  parallel_for(wk.nblocks * wk.mc, wk.grain, [&](int64_t i0, int64_t i1) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    alignas(64) int32_t c[MB * NB];
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t nb = it / wk.mc, mk = it % wk.mc;
      const int64_t n0 = nb * NB, cols = i8_min(NB, n - n0);
      const int panels = cols > kI8Panel ? 2 : 1;
      const int8_t* wb = w + (n0 / kI8Panel) * kI8Panel * kp;
      for (int64_t mb = mk * wk.mblocks / wk.mc; mb < (mk + 1) * wk.mblocks / wk.mc; ++mb) {
        const int64_t m0 = mb * MB, rows = i8_min(MB, m - m0);
        amx_block(act + m0 * kp, kp, wb, kI8Panel * kp, panels, c);
        i8_epilogue<AmxLayoutMicro>(a, c, NB, m0, rows, n0, cols, colsum, xs);
      }
    }
    _tile_release();
  });
}

void w8a8_linear_amx(const W8A8Args& a) {
  const bool tiles = a.m >= kAmxMinRows && amx_permitted();
  i8_quantize_rows<AmxLayoutMicro>(a, /*pad=*/tiles);  // the VNNI micro-kernel reads only m rows
  if (tiles) {
    amx_gemm(a);
  } else {
    i8_gemm<AmxLayoutMicro>(a);
  }
}

}  // namespace

extern const KernelTable kTable_amx;
constexpr KernelTable kTable_amx = int8_only_table(
    "amx", {&int8_packed_bytes<AmxLayoutMicro>, &int8_pack<AmxLayoutMicro>, &int8_unpack<AmxLayoutMicro>,
            &int8_workspace_bytes<AmxLayoutMicro>, &w8a8_linear_amx, &i8_quantize_row<AmxLayoutMicro>,
            &i8_gemm_panels<AmxLayoutMicro>});

}  // namespace anycore
