// The parameters autotune chooses (spec core.md §12). Global rank 0 decides them and broadcasts
// them with a response list of the global process set; every rank applies them at the end of that
// negotiation, so they change at the same point of every rank's operation sequence.
#pragma once

#include <cstdint>

namespace horovod {

struct TunedParameters {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0.0;
  bool cache_enabled = false;
  // Carried and logged for upstream's log format; no backend here has hierarchical or torus
  // variants yet, so they are never searched.
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
  bool torus_allreduce = false;
  // Whether rank 0 is still searching; false once the best parameters are fixed.
  bool tuning = false;
};

inline bool operator==(const TunedParameters& a, const TunedParameters& b) {
  return a.fusion_threshold_bytes == b.fusion_threshold_bytes && a.cycle_time_ms == b.cycle_time_ms &&
         a.cache_enabled == b.cache_enabled && a.hierarchical_allreduce == b.hierarchical_allreduce &&
         a.hierarchical_allgather == b.hierarchical_allgather && a.torus_allreduce == b.torus_allreduce &&
         a.tuning == b.tuning;
}

}  // namespace horovod
