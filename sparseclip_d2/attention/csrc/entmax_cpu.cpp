/*
 * Fused CPU kernel for exact alpha-entmax over the rows of a float32 (N, L) matrix.
 *
 * Definition.  With r = 1 / (alpha - 1) >= 1 and the per-row shift s in [0, 1],
 *
 *     w_i = 1 + (x_i - max(x)) / r        (so max_i w_i = 1)
 *     u_i = [w_i - s]_+,   p_i = u_i^r,   sum_i p_i = 1,
 *
 * which is alpha-entmax with threshold t = max(x) + r s (see entmax.py).
 *
 * Per row, the kernel makes
 *   1. one pass for the maximum m (and a flag for NaN / +inf entries);
 *   2. one pass collecting the candidates x_j > m - r (minus a rounding margin) as
 *      (w_j in double, j) into a per-thread buffer.  Every other entry has w_j <= 0,
 *      hence u_j = 0 for every s >= 0: it is exactly zero in the output.  -inf entries
 *      never pass the test;
 *   3. a safeguarded Newton iteration, in double, on the candidates only, for the root
 *      of h(s) = f(s)^(1/r) - 1 with f = sum u^r.  h is convex and decreasing in s
 *      (u_i is convex in s and a p-norm with p = r >= 1 is convex and monotone on the
 *      non-negative orthant), h(0) >= 0 because the largest entry alone has u = 1, so
 *      Newton from s = 0 increases monotonically to the root without overshooting.
 *      Dense rows start instead at s0 = mean(w) - K^(-1/r) when that is positive: by the
 *      power-mean inequality f(s0) >= K (mean(w) - s0)^r = 1, so s0 is also left of the
 *      root, and it saves about one Newton pass when nearly all K entries are in the
 *      support.
 *      While the support is fixed h is linear in s for equal entries and close to it
 *      otherwise, so a handful of steps suffice.  A bisection safeguard on the bracket
 *      [lo, hi] (initially [0, 1]; f(1) = 0 < 1) takes over whenever rounding produces
 *      a step outside it;
 *   4. one pass writing the output row: zeros, then u_j^r / f at the candidates
 *      (the final division makes the row sum to one up to rounding).
 *
 * Why it is exact: only provably-zero entries are pruned (the rounding margin can only
 * add candidates, which then get u = 0), and on the candidates the shift is the root of
 * the same equation, solved in double to a step below 1e-11, so the output equals
 * alpha-entmax up to float32 rounding of the result.
 *
 * The max and candidate passes use SSE2 (baseline on x86-64; plain loops elsewhere):
 * candidates are packed by a 16-entry table indexed by the 4-lane comparison mask.
 *
 * Powers: integer r (alpha = 2, 1.5, 4/3, 1.25, 1.2, 1.1, 1.05, ...) uses repeated
 * multiplication, compile-time unrolled (by squaring) for r <= 5, r = 10 and r = 20, with a
 * branch-free body (max(0, .) as (d + |d|) / 2) so that the Newton sums and the output
 * pass vectorise -- what dense rows, with every entry a candidate, spend their time on;
 * the compaction of dropped entries runs only when it removes over 1/8 of them.  Other
 * integer r uses a scalar squaring loop, other real r exp(r log u), in double.
 *
 * Errors are not raised here: the returned code has bit 1 set when some row is entirely
 * -inf and bit 2 when some row holds NaN or +inf; the Python wrapper raises.
 */
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace {

constexpr int kMaxIter = 100;
constexpr double kStepTol = 1e-11;

// u^n for integer n >= 0 by repeated squaring, with 0^0 = 0 (u = 0 is "outside the
// support", also for the u^(r-1) term of sparsemax).
inline double ipow(double u, int64_t n) {
  if (!(u > 0.0)) return 0.0;
  double result = 1.0;
  while (n) {
    if (n & 1) result *= u;
    n >>= 1;
    if (n) u *= u;
  }
  return result;
}

// u^N for a compile-time N >= 0 by squaring (branch-free, so loops using it vectorise).
template <int N>
inline double upow(double u) {
  if constexpr (N == 0) {
    return 1.0;
  } else if constexpr (N == 1) {
    return u;
  } else if constexpr (N % 2 == 0) {
    return upow<N / 2>(u * u);
  } else {
    return u * upow<N / 2>(u * u);
  }
}

// Run-time exponent r for the generic path (E == 0 in the templates below): u^(r-1)
// and u^r of u (0 for u <= 0), by squaring for integer r, else exp/log.  Compile-time
// exponents (E >= 1) use upow<E> instead.
struct Exponent {
  int64_t n;    // integer exponent r (when is_int)
  double r;     // real exponent r = 1 / (alpha - 1)
  bool is_int;
  // returns u^(r-1) and writes u^r
  inline double lower(double u, double* full) const {
    if (!(u > 0.0)) {
      *full = 0.0;
      return 0.0;
    }
    const double g = is_int ? ipow(u, n - 1) : std::exp((r - 1.0) * std::log(u));
    *full = g * u;
    return g;
  }
  inline double full(double u) const {
    double p;
    lower(u, &p);
    return p;
  }
};

// Root of f(s) = 1 given f = sum u^r and S = sum u^(r-1) at s: the Newton step on
// h = f^(alpha-1), (h - 1) / (-h'(s)) with -h'(s) = f^(alpha-2) S.  Written as
// e f / ((1 + e) S) with e = f^(alpha-1) - 1 computed without cancellation (expm1 keeps
// it accurate as alpha -> 1, where the first step is the log-sum-exp).
template <int E>
inline double newton_step(double f, double big_s, double am1) {
  double e;
  if constexpr (E == 1) {
    e = f - 1.0;
  } else if constexpr (E == 2) {
    e = (f - 1.0) / (std::sqrt(f) + 1.0);
  } else {
    e = std::expm1(am1 * std::log(f));
  }
  return e * f / ((1.0 + e) * big_s);
}

// Solves one row given its K candidates (w, idx; both overwritten, as is the scratch
// buffer w2) and writes the candidates' probabilities into out_row.  E >= 1: the
// compile-time integer exponent r = E; E == 0: the run-time exponent pw.
template <int E>
void solve_and_write(double* __restrict w, int32_t* __restrict idx, double* __restrict w2,
                     int64_t k, const Exponent& pw, float* out_row, double s0) {
  const double am1 = 1.0 / pw.r;  // alpha - 1
  // s0 in [0, 1): a start at or left of the root (see run_rows); bracket [0, 1] anyway.
  double s = s0, lo = 0.0, hi = 1.0;
  for (int it = 0; it < kMaxIter; ++it) {
    // f = sum u^r and S = sum u^(r-1) at s (vectorised reductions where E > 0).
    // Also counts the entries with u > 0 (w > s).
    double f = 0.0, big_s = 0.0, pos = 0.0;
    if constexpr (E >= 1) {
      // Branch-free body (max(0, .), then multiplications): vectorises.
#pragma omp simd reduction(+ : f, big_s, pos)
      for (int64_t j = 0; j < k; ++j) {
        const double d = w[j] - s;
        const double u = 0.5 * (d + std::abs(d));  // max(d, 0), exactly, branch-free
        const double in = static_cast<double>(d > 0.0);
        const double g = E == 1 ? in : upow<E - 1>(u);
        big_s += g;
        f += g * u;
        pos += in;
      }
    } else {
      for (int64_t j = 0; j < k; ++j) {
        double p;
        big_s += pw.lower(w[j] - s, &p);
        f += p;
        pos += w[j] > s ? 1.0 : 0.0;
      }
    }
    const bool left = f >= 1.0;  // h(s) >= 1: s is at or left of the root
    if (left) {
      // The iterates only grow from here (monotone Newton, bracket lo >= s), so the
      // entries with w <= s stay at zero for good: drop them -- when enough of them are
      // dropped to pay for the (scalar) compaction pass; kept ones just add zeros.
      lo = s;
      const int64_t npos = static_cast<int64_t>(pos);
      if (npos < k - (k >> 3)) {
        int64_t kept = 0;
        for (int64_t j = 0; j < k; ++j) {
          w[kept] = w[j];
          idx[kept] = idx[j];
          kept += w[j] > s;
        }
        k = kept;
      }
    } else {
      hi = s;
    }
    double step = newton_step<E>(f, big_s, am1);
    if (left && step < 0.0) step = 0.0;  // rounding at the root
    double s_new = s + step;
    if (!(s_new >= lo && s_new <= hi)) s_new = 0.5 * (lo + hi);  // also NaN
    const bool done = std::abs(s_new - s) <= kStepTol;
    s = s_new;
    if (done) break;
  }
  // Output at the final s: u^r / f (entries dropped above are exact zeros).
  double f = 0.0;
  if constexpr (E >= 1) {
#pragma omp simd reduction(+ : f)
    for (int64_t j = 0; j < k; ++j) {
      const double d = w[j] - s;
      const double p = upow<E>(0.5 * (d + std::abs(d)));
      w2[j] = p;
      f += p;
    }
  } else {
    for (int64_t j = 0; j < k; ++j) {
      w2[j] = pw.full(w[j] - s);
      f += w2[j];
    }
  }
  const double inv = 1.0 / f;
  for (int64_t j = 0; j < k; ++j) {
    out_row[idx[j]] = static_cast<float>(w2[j] * inv);
  }
}

// Maximum of a row; *bad is set when the row holds NaN or +inf.
inline float row_max(const float* xr, int64_t length, bool* bad) {
  const float inf = std::numeric_limits<float>::infinity();
  int64_t i = 0;
  float m = -inf;
  bool nan = false;
#ifdef __SSE2__
  if (length >= 8) {
    // _mm_max_ps(v, acc) returns acc when v is NaN: NaNs are tracked separately.
    __m128 m0 = _mm_set1_ps(-inf), m1 = m0, n0 = _mm_setzero_ps(), n1 = n0;
    for (; i + 8 <= length; i += 8) {
      const __m128 v0 = _mm_loadu_ps(xr + i), v1 = _mm_loadu_ps(xr + i + 4);
      m0 = _mm_max_ps(v0, m0);
      m1 = _mm_max_ps(v1, m1);
      n0 = _mm_or_ps(n0, _mm_cmpunord_ps(v0, v0));
      n1 = _mm_or_ps(n1, _mm_cmpunord_ps(v1, v1));
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_max_ps(m0, m1));
    for (float v : lanes) m = v > m ? v : m;
    nan = _mm_movemask_ps(_mm_or_ps(n0, n1)) != 0;
  }
#endif
  for (; i < length; ++i) {
    const float v = xr[i];
    m = v > m ? v : m;
    nan = nan || v != v;
  }
  *bad = nan || m == inf;
  return m;
}

#ifdef __SSE2__
// kPacked[mask] lists the set bits of a 4-bit mask, lowest first (unused lanes 0).
struct PackTable {
  alignas(16) int32_t lanes[16][4];
  int32_t count[16];
  constexpr PackTable() : lanes(), count() {
    for (int mask = 0; mask < 16; ++mask) {
      int n = 0;
      for (int bit = 0; bit < 4; ++bit) {
        if (mask & (1 << bit)) lanes[mask][n++] = bit;
      }
      count[mask] = n;
    }
  }
};
constexpr PackTable kPacked{};
#endif

// Writes the indices j with xr[j] > cut to idx (ascending) and returns their number.
// idx needs room for length + 4 entries (the vector path stores 4 lanes at a time).
inline int64_t collect(const float* xr, int64_t length, float cut, int32_t* idx) {
  int64_t k = 0, j = 0;
#ifdef __SSE2__
  const __m128 c = _mm_set1_ps(cut);
  for (; j + 4 <= length; j += 4) {
    const int mask = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(xr + j), c));
    const __m128i lanes =
        _mm_load_si128(reinterpret_cast<const __m128i*>(kPacked.lanes[mask]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + k),
                     _mm_add_epi32(lanes, _mm_set1_epi32(static_cast<int32_t>(j))));
    k += kPacked.count[mask];
  }
#endif
  for (; j < length; ++j) {  // branch-free compaction
    idx[k] = static_cast<int32_t>(j);
    k += xr[j] > cut;
  }
  return k;
}

template <int E>
int run_rows(const float* x, float* out, int64_t begin, int64_t end, int64_t length,
             const Exponent& pw) {
  const double r = pw.r;
  const double am1 = 1.0 / r;
  const float inf = std::numeric_limits<float>::infinity();
  // Candidates (w, idx) with slack for collect(), and the solver's scratch w2 after w.
  const int64_t stride = length + 8;
  std::vector<double> w(2 * static_cast<size_t>(stride));
  std::vector<int32_t> idx(static_cast<size_t>(stride));
  int code = 0;
  for (int64_t row = begin; row < end; ++row) {
    const float* xr = x + row * length;
    float* orow = out + row * length;
    // 1. maximum and NaN / +inf flag.
    bool bad = false;
    const float m = row_max(xr, length, &bad);
    std::fill(orow, orow + length, 0.0f);
    if (bad) { code |= 2; continue; }
    if (m == -inf) { code |= 1; continue; }
    // 2. candidates x_j > m - r; the margin makes rounding add candidates, never drop.
    const double md = static_cast<double>(m);
    const double cut_d = md - r - (std::abs(md) + r) * (8.0 * FLT_EPSILON);
    const float cut = std::nextafter(static_cast<float>(cut_d), -inf);
    const int64_t k = collect(xr, length, cut, idx.data());
    double wsum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = 1.0 + (static_cast<double>(xr[idx[j]]) - md) * am1;
      wsum += w[j];
    }
    // Start: by the power-mean inequality and (w - s)_+ >= w - s, for s <= mean(w)
    //   f(s) = sum (w_j - s)_+^r >= k (mean(w) - s)^r,
    // which is 1 at s0 = mean(w) - k^(-1/r): f(s0) >= 1, so s0 is at or left of the root
    // (the monotone Newton premise).  It matters for dense rows (many candidates with
    // similar w), where it starts Newton near the root; else it is <= 0 and s0 = 0.
    // Rounding may put s0 just right of the root: the bracket [0, 1] then handles it.
    double s0 = wsum / static_cast<double>(k) - std::exp(-std::log(static_cast<double>(k)) * am1);
    s0 = s0 > 0.0 && s0 < 1.0 ? s0 : 0.0;
    // 3-4. Newton on the candidates, then the output.
    solve_and_write<E>(w.data(), idx.data(), w.data() + stride, k, pw, orow, s0);
  }
  return code;
}

}  // namespace

// The part above is plain C++ (it can be compiled alone, e.g. for a micro-benchmark,
// with ENTMAX_CORE_ONLY defined); the part below binds it to torch.
#ifndef ENTMAX_CORE_ONLY
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace {

// A persistent pool of worker threads that run the chunks of one job together with the
// calling thread.  Chunks are claimed from an atomic counter, so a worker that wakes late
// (a loaded machine) just claims fewer chunks and the caller never waits for a thread to
// be scheduled: it waits only for chunks already claimed.  Used instead of
// at::parallel_for, which in an OpenMP build of torch is an inline template that runs in
// parallel only when this file is compiled with -fopenmp (serially under -fopenmp-simd),
// and -fopenmp would link a second OpenMP runtime beside torch's.  Created on first use
// and again after a fork (threads do not survive fork); never destroyed (its threads
// sleep on a condition variable until the process exits).
class RowPool {
 public:
  static RowPool& instance(int64_t threads) {
    static std::mutex creation;
    static RowPool* pool = nullptr;
    std::lock_guard<std::mutex> lock(creation);
    if (pool == nullptr || pool->pid_ != getpid() || pool->size_ < threads - 1) {
      pool = new RowPool(std::max<int64_t>(threads - 1, pool ? pool->size_ : 0));  // old one leaks
    }
    return *pool;
  }

  // Runs fn(c) for every chunk c in [0, chunks) on up to `threads` threads (caller included).
  void run(int64_t chunks, int64_t threads, const std::function<void(int64_t)>& fn) {
    std::lock_guard<std::mutex> serial(run_mutex_);  // one job at a time
    uint32_t gen;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gen = ++generation_;
      job_ = &fn;
      chunks_ = chunks;
      done_ = 0;
      active_ = threads - 1;
      ticket_.store(static_cast<uint64_t>(gen) << 32);
    }
    wake_.notify_all();
    const int64_t mine = work(gen, &fn, chunks);
    std::unique_lock<std::mutex> lock(mutex_);
    done_ += mine;
    finished_.wait(lock, [&] { return done_ == chunks_; });
    job_ = nullptr;
  }

 private:
  explicit RowPool(int64_t size) : size_(size), pid_(getpid()) {
    for (int64_t i = 0; i < size; ++i) std::thread([this] { loop(); }).detach();
  }

  // Claims and runs chunks of job `gen` until none is left.  A ticket holds the job's
  // generation (high 32 bits) and its next chunk (low 32 bits), so a late worker can never
  // claim a chunk of a later job with the earlier job's function.
  int64_t work(uint32_t gen, const std::function<void(int64_t)>* fn, int64_t chunks) {
    int64_t count = 0;
    uint64_t t = ticket_.load();
    while (static_cast<uint32_t>(t >> 32) == gen && static_cast<int64_t>(t & 0xffffffffu) < chunks) {
      if (ticket_.compare_exchange_weak(t, t + 1)) {
        (*fn)(static_cast<int64_t>(t & 0xffffffffu));
        ++count;
        t = ticket_.load();
      }
    }
    return count;
  }

  void loop() {
    uint32_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return job_ != nullptr && generation_ != seen && active_ > 0; });
      seen = generation_;
      --active_;
      const std::function<void(int64_t)>* fn = job_;
      const int64_t chunks = chunks_;
      lock.unlock();
      const int64_t mine = work(seen, fn, chunks);
      lock.lock();
      if (mine > 0) {  // the job cannot have finished without these chunks
        done_ += mine;
        if (done_ == chunks_) finished_.notify_one();
      }
    }
  }

  const int64_t size_;
  const pid_t pid_;
  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, finished_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t chunks_ = 0, done_ = 0, active_ = 0;
  uint32_t generation_ = 0;
  std::atomic<uint64_t> ticket_{0};
};

// Rows split into chunks of at least `grain` rows (about 4 per thread) run on
// at::get_num_threads() threads; serial for small inputs or inside a parallel region.
template <int E>
int dispatch_rows(const float* x, float* out, int64_t rows, int64_t length,
                  const Exponent& pw) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, length));
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (rows + grain - 1) / grain);
  if (threads <= 1 || at::in_parallel_region()) {
    return run_rows<E>(x, out, 0, rows, length, pw);
  }
  const int64_t chunk = std::max(grain, (rows + 4 * threads - 1) / (4 * threads));
  const int64_t chunks = (rows + chunk - 1) / chunk;
  std::atomic<int> code{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  RowPool::instance(threads).run(chunks, threads, [&](int64_t c) {
    try {
      const int64_t begin = c * chunk;
      const int r = run_rows<E>(x, out, begin, std::min(rows, begin + chunk), length, pw);
      if (r) code.fetch_or(r);
    } catch (...) {  // e.g. std::bad_alloc: rethrown on the calling thread
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
  return code.load();
}

std::tuple<at::Tensor, int64_t> entmax_rows(const at::Tensor& x, double r) {
  TORCH_CHECK(x.device().is_cpu(), "entmax_rows: x must be a CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "entmax_rows: x must be float32");
  TORCH_CHECK(x.dim() == 2, "entmax_rows: x must be 2-D (rows, length)");
  TORCH_CHECK(x.is_contiguous(), "entmax_rows: x must be contiguous");
  TORCH_CHECK(r >= 1.0 && std::isfinite(r), "entmax_rows: r = 1/(alpha-1) must be >= 1");
  const int64_t rows = x.size(0), length = x.size(1);
  TORCH_CHECK(length <= std::numeric_limits<int32_t>::max(), "entmax_rows: row too long");
  at::Tensor out = at::empty({rows, length}, x.options());
  if (rows == 0 || length == 0) return {out, 0};
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool is_int = r == std::floor(r) && r <= 1e6;
  const int64_t n = is_int ? static_cast<int64_t>(r) : 0;
  const Exponent pw{n, r, is_int};
  int code;
  switch (is_int ? n : 0) {
    case 1: code = dispatch_rows<1>(xp, op, rows, length, pw); break;
    case 2: code = dispatch_rows<2>(xp, op, rows, length, pw); break;
    case 3: code = dispatch_rows<3>(xp, op, rows, length, pw); break;
    case 4: code = dispatch_rows<4>(xp, op, rows, length, pw); break;
    case 5: code = dispatch_rows<5>(xp, op, rows, length, pw); break;
    case 10: code = dispatch_rows<10>(xp, op, rows, length, pw); break;
    case 20: code = dispatch_rows<20>(xp, op, rows, length, pw); break;
    default: code = dispatch_rows<0>(xp, op, rows, length, pw);
  }
  return {out, static_cast<int64_t>(code)};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("entmax_rows", &entmax_rows,
        "Exact alpha-entmax over the rows of a contiguous float32 (N, L) CPU tensor; "
        "r = 1/(alpha-1).  Returns (probabilities, error code: 1 all -inf row, 2 NaN/+inf).",
        pybind11::arg("x"), pybind11::arg("r"));
}
#endif  // ENTMAX_CORE_ONLY
