"""ModelRouting: one model's fleet routing at the ingress: its prompts rendered to token ids (off the event loop, as
its engine renders them; engine/prompt_render.py) and the `FleetRouter` that ranks its replicas by them.

Rendering costs the ingress about 3 ms of CPU for a 1,300-token chat prompt (SmolLM2's tokenizer, measured on the
2-core EPYC); a prompt that cannot be rendered here (the replica will refuse it with the reason) is routed by load
alone. One model with one replica renders nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from app.config.common import tightest
from app.config.model import ModelConfig
from app.engine.interface import GenerateRequest, PromptInput
from app.engine.prompt_render import Renderer, ingress_renderer, render_prompt, truncated
from app.host.replica_load import ReplicaLoad
from app.routing.decision import Decision
from app.routing.fleet_router import FleetRouter

log = logging.getLogger(__name__)


class ModelRouting:
    def __init__(self, model: ModelConfig, renderer: Renderer | None, router: FleetRouter | None = None):
        self.model = model
        self.router = router or FleetRouter()
        self._renderer = renderer
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"route-render-{model.id}")

    @classmethod
    def for_model(cls, model: ModelConfig, stats_period_s: float) -> ModelRouting:
        """`stats_period_s`: how often the replicas' reports come (Serve's routing-stats period)."""
        return cls(model, ingress_renderer(model), FleetRouter(stats_period_s))

    def _ids(self, prompt: PromptInput) -> list[int] | None:
        if self._renderer is None:
            return None
        try:
            ids = render_prompt(self._renderer, prompt)
        except Exception:  # the replica renders it again and refuses it with the reason
            return None
        if prompt.truncate_to is not None:
            if prompt.truncate_to > self.model.engine.max_model_len:
                return None
            ids = truncated(ids, prompt.truncate_to, prompt.truncation_side, self.model.engine.max_model_len)
        return ids

    async def prompt_ids(self, prompt: PromptInput) -> list[int] | None:
        """The prompt's token ids as its engine will see them; None when they cannot be known here."""
        if prompt.token_ids is not None and prompt.truncate_to is None:
            return list(prompt.token_ids)
        if self._renderer is None:
            return None
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._ids, prompt)

    def decide(self, loads: Mapping[str, ReplicaLoad], prompt_ids: list[int] | None, request: GenerateRequest,
               avoid: frozenset[str], session: str = "") -> Decision | None:
        """The replicas ranked for `request`; a continuation has no first-token target (its client has had one)."""
        target = None if request.continuation else tightest(self.model.deployment.ttft_target_s,
                                                            request.ttft_target_s)
        return self.router.choose(loads, prompt_ids, target, avoid, session, request.params.cache_salt)
