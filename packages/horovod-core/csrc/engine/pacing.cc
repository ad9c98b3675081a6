// The engine's pacing: when the background thread runs a cycle (woken by a submission, gathering
// its burst, polling while callers execute, backing off while idle), and caller execution (a
// waiting caller running the cycles itself). engine.h's threading contract says why.
#include <algorithm>

#include "engine/engine.h"

namespace horovod {

namespace {

// A burst of submissions is over once none came for this long (see BackgroundLoop).
constexpr std::chrono::microseconds kQuietPeriod{50};
// Caller execution: while this rank submitted work in the last kActiveWindow, the background
// thread looks at the queues once per cycle time instead of being woken by each submission (see
// BackgroundLoop).
constexpr std::chrono::milliseconds kActiveWindow{10};

}  // namespace

void Engine::NotifyWaiting() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    waiting_ = true;
    wake_ = true;
  }
  wake_cv_.notify_one();
}

void Engine::Wake() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
}

bool Engine::CallerExecutionUsable() const {
  return caller_execution_ && !gpu_submitted_.load(std::memory_order_relaxed);
}

bool Engine::ExecuteWhileWaiting(HandleState& state, std::chrono::milliseconds budget) {
  if (!CallerExecutionUsable()) return state.done();
  // While callers execute (or wait for the lock to do so), the background thread does not start
  // cycles for them (BackgroundLoop).
  struct Executing {
    std::atomic<int>& count;
    explicit Executing(std::atomic<int>& c) : count(c) { count.fetch_add(1, std::memory_order_seq_cst); }
    ~Executing() { count.fetch_sub(1, std::memory_order_seq_cst); }
  } executing(callers_executing_);
  const auto deadline = std::chrono::steady_clock::now() + budget;
  // When another thread is in a cycle, wait for it: that cycle may complete the handle, and if it
  // does not, this caller runs the next one.
  std::unique_lock<std::timed_mutex> lock(cycle_mu_, std::defer_lock);
  if (!lock.try_lock_until(deadline)) return state.done();
  // (A GPU tensor submitted meanwhile: the cycles go to the background thread.)
  while (!stopped_ && !state.done() && CallerExecutionUsable()) {
    const auto start = std::chrono::steady_clock::now();
    caller_cycles_.fetch_add(1, std::memory_order_relaxed);
    if (!CycleLocked(start)) {
      // The engine stopped in this cycle: the background thread fails what is pending and closes
      // the connections.
      lock.unlock();
      Wake();
      break;
    }
    if (state.done()) break;
    const auto end = std::chrono::steady_clock::now();
    const auto cycle = std::chrono::microseconds(cycle_time_us_.load());
    if ((!progress_ && end - start < cycle / 4) || end >= deadline) break;
  }
  return state.done();
}

bool Engine::Wait(HandleState& state, std::chrono::milliseconds budget) {
  if (ExecuteWhileWaiting(state, budget)) return true;
  NotifyWaiting();
  return state.WaitFor(budget);
}

void Engine::BackgroundLoop() {
  using Clock = std::chrono::steady_clock;
  BackgroundThreadStarted();
  bool again = false;
  int idle = 0;  // consecutive cycles that had nothing to do on this rank
  // Caller execution: when this rank last submitted something (as seen from this thread).
  uint64_t submissions_seen = submissions_.load();
  auto last_submission = Clock::now() - kActiveWindow;
  while (true) {
    // Read every cycle: autotune changes it (ApplyParameters).
    const auto cycle = std::chrono::microseconds(cycle_time_us_.load());
    bool woken = false;
    {
      // An idle rank cycles less and less often (up to 16 cycle times apart): it has nothing to
      // batch, and its own submissions wake it at once. Its cycles only let the others notice a
      // shutdown or a stall, which takes a few milliseconds longer instead of costing a tenth of
      // a core per process while idle.
      // The periodic cycle is due this long after the last cycle of any thread (a caller's count too).
      auto due = [&](std::chrono::microseconds period) {
        return Clock::time_point(Clock::duration(last_cycle_start_.load())) + period * (1 << std::min(idle, 4));
      };
      // While the rank submits asynchronous work and the host has no core to spare, every cycle
      // of this thread takes a core from the training, and its negotiation wakes the peers'
      // threads on theirs: there it gathers the submissions of busy_poll_period_ into one cycle
      // (fewer, larger fused operations) unless the user chose the cycle time. A caller of this
      // rank that waits is not delayed: it runs the cycle itself, or wakes this thread at once.
      const auto poll_period = std::max<std::chrono::microseconds>(cycle, busy_poll_period_);
      std::unique_lock<std::mutex> lock(wake_mu_);
      while (!again) {
        // With caller execution, a submission does not wake this thread while the rank is busy
        // (it submitted in the last kActiveWindow): the caller usually waits right away and runs
        // the cycle itself, and waking this thread for every operation would take a core from
        // the callers of this rank and its peers at the moment they need it. Instead this thread
        // looks once per cycle time for operations that were submitted and that no caller waits on
        // (asynchronous ones, such as gradients during the backward pass), and runs the cycle
        // for them. A caller that waits without running the cycle itself wakes it (NotifyWaiting).
        const uint64_t count = submissions_.load(std::memory_order_seq_cst);
        const auto now = Clock::now();
        if (count != submissions_seen) {
          submissions_seen = count;
          last_submission = now;
        }
        const bool poll = CallerExecutionUsable() && now - last_submission < kActiveWindow;
        if (poll) polling_.store(true, std::memory_order_seq_cst);
        const auto period = poll ? poll_period : cycle;
        const auto until = poll ? std::min<Clock::time_point>(due(period), now + period) : due(period);
        woken = wake_cv_.wait_until(lock, until, [this] { return wake_; });
        polling_.store(false, std::memory_order_seq_cst);
        if (woken || Clock::now() >= due(period)) break;
        lock.unlock();
        woken = callers_executing_.load(std::memory_order_seq_cst) == 0 && sets_->AnyWaiting() &&
                !sets_->AnyCallerWaiting();
        lock.lock();
        if (woken) break;
      }
      if (woken && !waiting_) {
        // Woken by a submission: gather the rest of its burst first (a training step submits
        // its gradients back to back), until nothing was submitted for kQuietPeriod, a caller
        // blocks on a handle, or the cycle time (the bound on batching) is over. Cycling on
        // every submission instead costs one negotiation each, and on a machine with as many
        // processes as cores it takes the core from the thread that is submitting.
        coalescing_.store(true, std::memory_order_seq_cst);
        const auto deadline = std::chrono::steady_clock::now() + cycle;
        uint64_t seen = submissions_.load(std::memory_order_seq_cst);
        while (!waiting_ && !shutdown_requested_.load() && std::chrono::steady_clock::now() < deadline) {
          wake_cv_.wait_for(lock, std::min<std::chrono::microseconds>(kQuietPeriod, cycle),
                            [this] { return waiting_ || shutdown_requested_.load(); });
          const uint64_t now = submissions_.load(std::memory_order_seq_cst);
          if (now == seen) break;
          seen = now;
        }
        coalescing_.store(false, std::memory_order_seq_cst);
      }
      wake_ = false;
      waiting_ = false;
    }
    std::unique_lock<std::timed_mutex> cycle_lock(cycle_mu_);
    if (stopped_) break;  // a caller's cycle ended the engine
    // Woken by a submission or a waiting caller, but nothing of this rank is left to negotiate:
    // a caller ran the cycle that executed it (caller execution), or the cycle that just ran
    // was completing the handle a caller then started to wait on (a step that waits on its
    // handles in turn). A cycle now would be an empty negotiation round that the other ranks'
    // next cycles must meet first.
    // The same when this thread meant to cycle again at once for operations that waited on other
    // ranks, and a caller executed them while this thread waited for the lock.
    if ((woken || again) && !shutdown_requested_.load() && !sets_->AnyWaiting()) {
      again = false;
      continue;
    }
    if (follow_caller_.load(std::memory_order_relaxed)) FollowCaller();
    const auto start = Clock::now();
    if (!CycleLocked(start)) break;
    // The cycle time bounds how long submitted work waits; it is not a sleep every operation
    // pays. While this rank has operations waiting for the other ranks, the next cycle starts
    // at once: its negotiation blocks until another rank's cycle meets it (when that rank submits
    // them, or its cycle time expires), so the operations run as soon as the last rank submits.
    // A quick cycle that ran nothing means every rank is waiting on the others (a stall, or
    // ranks that submitted in incompatible orders): then the cycle time applies again, instead
    // of spinning.
    again = false;
    const bool waiting = sets_->AnyWaiting();
    // (Not while a caller executes: it runs the next cycle itself.)
    if (progress_ || std::chrono::steady_clock::now() - start >= cycle / 4) {
      again = waiting && callers_executing_.load(std::memory_order_seq_cst) == 0;
    }
    idle = (progress_ || waiting) ? 0 : idle + 1;
  }
  CloseAfterStop();
}

}  // namespace horovod
