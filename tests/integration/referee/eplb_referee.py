"""The referee of the EPLB test: vLLM's own EPLB state, read inside each vLLM worker.

Mixed into vLLM's worker with `--worker-extension-cls eplb_referee.EplbReferee` (this folder on
PYTHONPATH) and called through vLLM's dev-mode `POST /collective_rpc {"method": "eplb_truth",
"args": [DIR]}`. It reads vLLM's tensors directly, none of the plugin's hooks or hand-over. Every
engine runs it, but with data parallelism vLLM answers only the first engine's result: each
worker also writes its own to DIR/ep-rank-N.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class EplbReferee:
    model_runner: Any

    def eplb_truth(self, directory: str) -> dict[str, Any]:
        from vllm.distributed.parallel_state import get_ep_group

        state = self.model_runner.eplb_state
        (model,) = state.model_states.values()
        truth = {
            "ep_rank": get_ep_group().rank_in_group,
            "phy2log": model.physical_to_logical_map.tolist(),
            "replicas": model.logical_replica_count.tolist(),
            "in_flight": bool(model.rebalanced),  # async: a rearrangement whose layers are not all moved yet
            "last_expert_load": model.last_expert_load.tolist() if model.last_expert_load is not None else None,
            "local_experts": int(model.model.num_local_physical_experts),
        }
        (Path(directory) / f"ep-rank-{truth['ep_rank']}.json").write_text(json.dumps(truth))
        return truth
