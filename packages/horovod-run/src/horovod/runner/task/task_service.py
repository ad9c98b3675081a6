"""``horovodrun``'s task service, one per host during the interface probe."""

from horovod.runner.common.service import task_service


class HorovodRunTaskService(task_service.BasicTaskService):
    NAME_FORMAT = "horovod task service #%d"

    def __init__(self, index, key, nics):
        super().__init__(HorovodRunTaskService.NAME_FORMAT % index, index, key, nics)


class HorovodRunTaskClient(task_service.BasicTaskClient):
    def __init__(self, index, task_addresses, key, verbose, match_intf=False, attempts=3):
        super().__init__(HorovodRunTaskService.NAME_FORMAT % index, task_addresses, key, verbose,
                         match_intf=match_intf, attempts=attempts)
