// Executing a negotiated response list on this rank: each response's entries are taken out of the
// set's queue, executed by their collective (csrc/collectives/) on the executor of their device,
// and their handles completed; error responses fail their entries after the list.
#include <stdexcept>

#include "collectives/collective.h"
#include "engine/engine.h"

namespace horovod {

void Engine::PerformAll(ProcessSet& set, const ResponseList& list) {
  if (timeline_.recording()) {
    // Each operation waits in the QUEUE activity until the ones before it in the list are done.
    for (const Response& response : list.responses) {
      for (const auto& name : response.names) {
        timeline_.Start(name, response.type);
        timeline_.ActivityStart(name, "QUEUE");
      }
    }
  }
  if (list.responses.empty()) return;
  progress_ = true;
  const int64_t negotiated_us = recorder_->enabled() ? WallMicros() : 0;
  for (const Response& response : list.responses) Perform(set, response, negotiated_us);
  if (!failed_.empty()) {
    // Error responses (a mismatch, a deadlock) failed operations of this rank: the flight recorder
    // is written before their callers learn it (and go on submitting).
    recorder_->DumpAutomatically(failed_.front().second, sets_->Ranks());
    for (auto& [entry, message] : failed_) entry.handle->Complete(entry.index, Status::PreconditionError(message));
    failed_.clear();
  }
}

void Engine::Perform(ProcessSet& set, const Response& response, int64_t negotiated_us) {
  // This rank's entries; a rank that has joined has none for the others' allreduces.
  std::vector<TensorTableEntry> owned(response.names.size());
  std::vector<TensorTableEntry*> entries(response.names.size(), nullptr);
  for (size_t i = 0; i < response.names.size(); ++i) {
    if (set.queue.TryTake(response.names[i], &owned[i])) entries[i] = &owned[i];
  }
  recorder_->Started(entries, negotiated_us);
  const bool record = timeline_.recording();
  auto end_all = [&] {
    if (record) {
      for (const auto& name : response.names) timeline_.End(name);
    }
  };
  if (record) {
    for (const auto& name : response.names) timeline_.ActivityEnd(name);  // QUEUE
  }
  if (response.type == OpType::ERROR) {
    end_all();
    recorder_->Ended(entries, response.error_message);
    for (auto* e : entries) {
      if (e) failed_.emplace_back(std::move(*e), response.error_message);  // completed by PerformAll
    }
    return;
  }
  const Collective& collective = CollectiveFor(response.type);
  const bool may_lack = collective.joined_ranks_take_part() && set.controller->joined();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i] && !may_lack) {
      throw std::logic_error("negotiated tensor '" + response.names[i] + "' is not in this rank's table");
    }
  }
  // Engine-allocated outputs, per entry (empty where the caller gave the output).
  std::vector<std::vector<std::shared_ptr<OutputBuffer>>> outputs(entries.size());
  std::optional<int64_t> value;
  try {
    DeviceExecutor& executor = executors_.For(set, response.device, entries);
    // The body captures one reference, so the std::function holds it without allocating.
    auto body = [&] {
      ExecutionContext context{response,      entries,  outputs,      executor.CommunicatorOf(set),
                               executor,      set.ranks, set.set_rank, timeline_,
                               sets_.get(),   std::nullopt};
      collective.Execute(context);
      value = context.value;
    };
    executor.Run(entries, [&body] { body(); });
  } catch (const std::exception& e) {
    // The failure ends the engine (BackgroundLoop); these entries are no longer in the queue, so
    // they are failed here.
    end_all();
    Status failed = Status::UnknownError(std::string("Horovod ") + OpTypeName(response.type) + " failed: " + e.what());
    recorder_->Ended(entries, failed.reason());
    for (auto* entry : entries) {
      if (entry) entry->handle->Complete(entry->index, failed);
    }
    throw;
  }
  if (record) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& name = response.names[i];
      if (!outputs[i].empty()) {
        timeline_.End(name, outputs[i][0]->dtype(), outputs[i][0]->shape());
      } else if (entries[i] && entries[i]->output.data != nullptr) {
        timeline_.End(name, entries[i]->output.dtype, entries[i]->output.shape);
      } else {
        timeline_.End(name);
      }
    }
  }
  recorder_->Ended(entries, "");
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i]) continue;
    if (value) {
      entries[i]->handle->CompleteWithValue(entries[i]->index, *value);
    } else {
      entries[i]->handle->Complete(entries[i]->index, Status::OK(), std::move(outputs[i]));
    }
  }
}

}  // namespace horovod
