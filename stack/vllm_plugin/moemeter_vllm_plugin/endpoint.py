"""Entry point `vllm.endpoint_plugins`: GET /moemeter/experts on the API server (opt-in, as vLLM
requires of endpoint plugins: VLLM_PLUGINS=moemeter)."""

from __future__ import annotations

from argparse import Namespace
from typing import Any


class MoemeterEndpoint:
    name = "moemeter"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        from fastapi.responses import JSONResponse

        from .exporter import experts_snapshot
        from .hooks import state_dir

        @app.get("/moemeter/experts")
        def experts() -> Any:
            snap = experts_snapshot(state_dir())
            if snap is None:  # 503, not 404: the endpoint exists, there is just nothing to show yet
                return JSONResponse(
                    {"error": "no MoE routing measured yet"}, status_code=503, headers={"Retry-After": "5"}
                )
            return JSONResponse(snap)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        return None
