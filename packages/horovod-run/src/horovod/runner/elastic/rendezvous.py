"""The rendezvous server's handler in elastic mode: workers ask it for their slot."""

import json

from horovod.common.rendezvous import RendezvousHandler
from horovod.runner.common.util import codec
from horovod.runner.common.util.hosts import INVALID_SLOT_INFO

GET_RANK_AND_SIZE = "rank_and_size"
PUT_WORKER_ADDRESSES = "worker_addresses"
# Our addition: the slot and the generation (the rendezvous round) in one answer, as JSON.
GET_ELASTIC_SLOT = "elastic_slot"


def _parse_slot_key(key):
    host, _, local_rank = key.rpartition(":")
    return host, int(local_rank)


def create_rendezvous_handler(driver):
    """A :class:`RendezvousHandler` subclass answering the elastic requests of ``driver``.

    * ``GET /rank_and_size/<host>:<local_rank>`` blocks until the worker's round is decided
      and answers ``"rank,size,local_rank,local_size,cross_rank,cross_size"`` (rank -1: the slot
      was removed or the job ended).
    * ``GET /elastic_slot/<host>:<local_rank>``: the same as JSON, with the generation that
      fences the worker's next rendezvous (``{"slot": "...", "generation": g}``).
    * ``PUT /worker_addresses/<host>:<local_rank>`` with a base64 cloudpickle of
      ``(addresses, key)`` registers the worker's notification service with the driver.
    """

    class ElasticRendezvousHandler(RendezvousHandler):
        def handle_get(self, scope, key):
            if scope in (GET_RANK_AND_SIZE, GET_ELASTIC_SLOT):
                try:
                    host, local_rank = _parse_slot_key(key)
                except ValueError:
                    return 400, b"the key must be <host>:<local_rank>"
                generation = driver.record_ready(host, local_rank)
                slot_info = (INVALID_SLOT_INFO if generation is None
                             else driver.get_slot_info(host, local_rank))
                answer = slot_info.to_response_string()
                if scope == GET_ELASTIC_SLOT:
                    return 200, json.dumps({"slot": answer, "generation": generation or 0}).encode()
                return 200, answer.encode("ascii")
            return super().handle_get(scope, key)

        def handle_put(self, scope, key, value):
            if scope == PUT_WORKER_ADDRESSES:
                try:
                    host, local_rank = _parse_slot_key(key)
                    addresses, secret_key = codec.loads_base64(value)
                except Exception:
                    return 400, b"worker_addresses takes (addresses, key) as base64 cloudpickle"
                driver.register_worker_server(host, local_rank, addresses, secret_key)
            return super().handle_put(scope, key, value)

    return ElasticRendezvousHandler
