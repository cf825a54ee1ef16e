"""The Grafana side of the mixin: every panel of every board in one table (`panels`), built into
dashboards with Grafana's own grafana-foundation-sdk, and rendered into docs/grafana.md.

Headline panels read the recording rules of warehouse/promql.py (a figure's PromQL is never typed
again here); the rest read families of the contract directly. Every board has the variables
`rack`, `pool` (the `role` label), `instance` and `engine`, each a regex whose "All" is `.*`, so a
target without a `rack` label is matched too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from warehouse.promql import GPU_PRICE, POOL_GPUS, RULE_WINDOW, Figure, figures
from warehouse.slo import SloClass

DATASOURCE_UID = "moemeter-prometheus"
"""The uid of the Prometheus datasource the provisioning file declares and the boards default to."""
VARIABLES = {"rack": "rack", "pool": "role", "instance": "instance", "engine": "engine"}
"""Each board's template variables and the label each filters."""
VARIABLE_QUERIES = {
    "rack": "label_values(up, rack)",
    "pool": 'label_values(up{rack=~"$rack"}, role)',
    "instance": 'label_values(up{rack=~"$rack", role=~"$pool"}, instance)',
    # `engine` is vLLM's own label (a DP engine's index), on its series, not on the target
    "engine": 'label_values(vllm:num_requests_running{rack=~"$rack", role=~"$pool", instance=~"$instance"}, engine)',
}
"""Each variable's choices, each narrowed by the variables before it."""
RATE = "$__rate_interval"
KINDS = ("stat", "timeseries", "heatmap")
"""The panel types a Panel may be drawn as; a heatmap's expression returns histogram buckets by `le`."""

BOARDS = {
    "moemeter-overview": "moemeter: rack overview",
    "moemeter-dp-ranks": "moemeter: DP ranks",
    "moemeter-eplb": "moemeter: EPLB hot spots",
    "moemeter-slo": "moemeter: SLOs and burn",
    "moemeter-cost": "moemeter: cost",
    "moemeter-spec": "moemeter: speculative decoding",
}
PLUGIN_NOTE = "Needs the moemeter vLLM plugin's families (stack/vllm_plugin): empty without it."


@dataclass(frozen=True)
class Panel:
    board: str  # a key of BOARDS
    title: str
    expr: str  # PromQL with the board's variables
    unit: str  # a Grafana unit id
    legend: str = ""
    kind: str = "timeseries"  # one of KINDS
    plugin: bool = False  # reads the moemeter vLLM plugin's families
    description: str = ""

    def __post_init__(self) -> None:
        if self.board not in BOARDS:
            raise ValueError(f"panel {self.title!r}: no board {self.board!r}")
        if self.kind not in KINDS:
            raise ValueError(f"panel {self.title!r}: kind {self.kind!r} is none of {', '.join(KINDS)}")

    @property
    def text(self) -> str:
        """The panel's description as Grafana shows it."""
        return " ".join(p for p in (self.description, PLUGIN_NOTE if self.plugin else "") if p)


def _select(*labels: str) -> str:
    """The variables' matchers for the labels a series carries."""
    return ", ".join(f'{VARIABLES[v]}=~"${v}"' for v in labels)


def _record(f: Figure, *labels: str) -> str:
    """A figure's recorded series, filtered by the variables of the labels it keeps."""
    name, _, fixed = f.record.partition("{")
    matchers = [m for m in (fixed.rstrip("}"), _select(*labels)) if m]
    return f"{name}{{{', '.join(matchers)}}}"


def _engines(family: str) -> str:
    return f"{family}{{{_select('rack', 'pool', 'instance', 'engine')}}}"


def _rate(family: str, by: str) -> str:
    return f"sum by ({by}) (rate({_engines(family)}[{RATE}]))"


def panels(slo: SloClass) -> list[Panel]:
    """Every panel of the mixin's boards, in board order."""
    f = {x.key: x for x in figures(slo)}

    def figure(board: str, key: str, kind: str = "timeseries", legend: str = "{{role}}") -> Panel:
        fig = f[key]
        labels = ["rack"] + (["pool"] if "role" in fig.by else []) + (["instance"] if "instance" in fig.by else [])
        return Panel(
            board,
            fig.title,
            _record(fig, *labels),
            fig.unit,
            legend,
            kind,
            fig.plugin,
            f"docs/definitions.md, {fig.definition}; recorded over {RULE_WINDOW} as `{fig.record}`.",
        )

    engine = "rack, role, instance, engine"
    out = [
        figure("moemeter-overview", "rack_tokens_per_gpu", "stat", "{{rack}}"),
        figure("moemeter-overview", "prefill_computed_tokens_per_gpu", "stat"),
        figure("moemeter-overview", "decode_tokens_per_gpu", "stat"),
        figure("moemeter-overview", "user_tokens_per_second_p90", "stat"),
        figure("moemeter-overview", "ttft_p90_seconds", "stat"),
        figure("moemeter-overview", "itl_p50_seconds", "stat"),
        figure("moemeter-overview", "prefill_logical_tokens_per_gpu"),
        figure("moemeter-overview", "decode_tokens_per_gpu"),
        figure("moemeter-overview", "ttft_p90_seconds"),
        figure("moemeter-overview", "user_tokens_per_second_p90"),
        figure("moemeter-overview", "kv_cache_usage_mean"),
        figure("moemeter-overview", "requests_waiting"),
        figure("moemeter-overview", "acceptance_length"),
        figure("moemeter-overview", "pool_usd_per_mtok"),
        Panel(
            "moemeter-overview",
            "TTFT distribution",
            _rate("vllm:time_to_first_token_seconds_bucket", "le"),
            "s",
            "{{le}}",
            "heatmap",
            description="Requests per second by time to first token, in vLLM's own buckets, over the selected "
            "pools and engines (the TTFT P90 panels read the prefill pool's alone).",
        ),
        Panel(
            "moemeter-dp-ranks",
            "Requests waiting per engine",
            f"sum by ({engine}) ({_engines('vllm:num_requests_waiting')})",
            "short",
            "{{role}} {{instance}} engine {{engine}}",
            description="A DP engine whose queue stays over its pool's median is a straggler (docs/alerts.md).",
        ),
        Panel(
            "moemeter-dp-ranks",
            "Requests running per engine",
            f"sum by ({engine}) ({_engines('vllm:num_requests_running')})",
            "short",
            "{{role}} {{instance}} engine {{engine}}",
        ),
        Panel(
            "moemeter-dp-ranks",
            "KV-cache use per engine",
            f"max by ({engine}) ({_engines('vllm:kv_cache_usage_perc')})",
            "percentunit",
            "{{role}} {{instance}} engine {{engine}}",
        ),
        Panel(
            "moemeter-dp-ranks",
            "Engine step time (mean)",
            f"{_rate('moemeter_step_seconds_sum', engine)} / {_rate('moemeter_step_seconds_count', engine)}",
            "s",
            "{{role}} {{instance}} engine {{engine}}",
            plugin=True,
            description="Every rank's all-to-all waits for the slowest engine step.",
        ),
        Panel(
            "moemeter-dp-ranks",
            "Engine step time distribution",
            _rate("moemeter_step_seconds_bucket", "le"),
            "s",
            "{{le}}",
            "heatmap",
            plugin=True,
            description="Engine steps per second by duration, all selected engines.",
        ),
        Panel(
            "moemeter-dp-ranks",
            "Mean acceptance length per engine",
            f"1 + {_rate('vllm:spec_decode_num_accepted_tokens_total', engine)}"
            f" / {_rate('vllm:spec_decode_num_drafts_total', engine)}",
            "short",
            "{{role}} {{instance}} engine {{engine}}",
        ),
        figure("moemeter-eplb", "layer_balancedness", legend="layer {{layer}}"),
        Panel(
            "moemeter-eplb",
            "Tokens routed per rank",
            _rate("moemeter_expert_rank_tokens_total", "rack, instance, engine"),
            "short",
            "{{instance}} rank {{engine}}",
            plugin=True,
            description="Top-k tokens routed to each rank's physical experts, all layers.",
        ),
        Panel(
            "moemeter-eplb",
            "Hottest experts' share of their layer",
            f"max by (rack, instance, layer, expert) (moemeter_expert_hot_share{{{_select('rack', 'instance')}}})",
            "percentunit",
            "layer {{layer}} expert {{expert}}",
            plugin=True,
        ),
        Panel(
            "moemeter-eplb",
            "EPLB rebalances",
            f"sum by (rack, instance) (increase(moemeter_eplb_rebalances_total{{{_select('rack', 'instance')}}}[1h]))",
            "short",
            "{{instance}}",
            plugin=True,
            description="Rebalances in the last hour (0 while EPLB is off).",
        ),
    ]
    burns = [x for x in f.values() if x.key.startswith("slo_")]
    for window in ("5m", "30m", "1h", "6h"):
        out.append(
            Panel(
                "moemeter-slo",
                f"Error-budget burn rate ({window})",
                f"moemeter:slo_burn:rate{window}{{{_select('rack')}}}",
                "short",
                "{{objective}}",
                description=f"Held to the {slo.name} class ({slo.objective:.2%} of requests); 1 spends the budget "
                f"in exactly {slo.period_days:g} days. Objectives: " + ", ".join(b.title for b in burns) + ".",
            )
        )
    out += [
        figure("moemeter-cost", "pool_usd_per_mtok"),
        Panel(
            "moemeter-cost",
            "$/M tokens per pool (1 h)",
            f"moemeter:pool_usd_per_mtok:1h{{{_select('rack', 'pool')}}}",
            "currencyUSD",
            "{{role}}",
            description="The alert pack's 1-hour figure, which CostPerTokenSpike compares with its 24-hour one.",
        ),
        Panel(
            "moemeter-cost",
            "GPU cost per hour",
            f"{POOL_GPUS}{{{_select('rack', 'pool')}}} * on (rack, role) {GPU_PRICE}{{{_select('rack', 'pool')}}}",
            "currencyUSD",
            "{{role}}",
            description="Each pool's GPUs x the price sheet's GPU-hour price, as recorded when the mixin was written.",
        ),
        Panel(
            "moemeter-cost",
            "GPUs per pool",
            f"{POOL_GPUS}{{{_select('rack', 'pool')}}}",
            "short",
            "{{role}}",
            "stat",
        ),
        figure("moemeter-spec", "acceptance_length"),
        Panel(
            "moemeter-spec",
            "Acceptance rate per pool",
            f"{_rate('vllm:spec_decode_num_accepted_tokens_total', 'rack, role')}"
            f" / {_rate('vllm:spec_decode_num_draft_tokens_total', 'rack, role')}",
            "percentunit",
            "{{role}}",
            description="Accepted draft tokens / draft tokens (docs/definitions.md, Speculative decoding).",
        ),
        Panel(
            "moemeter-spec",
            "Acceptance per draft position",
            f"{_rate('vllm:spec_decode_num_accepted_tokens_per_pos_total', 'rack, role, position')}"
            f" / on (rack, role) group_left () {_rate('vllm:spec_decode_num_drafts_total', 'rack, role')}",
            "percentunit",
            "{{role}} position {{position}}",
        ),
        Panel(
            "moemeter-spec",
            "Drafts per second",
            _rate("vllm:spec_decode_num_drafts_total", "rack, role"),
            "short",
            "{{role}}",
        ),
        Panel(
            "moemeter-spec",
            "Mean acceptance length per engine",
            f"1 + {_rate('vllm:spec_decode_num_accepted_tokens_total', engine)}"
            f" / {_rate('vllm:spec_decode_num_drafts_total', engine)}",
            "short",
            "{{role}} {{instance}} engine {{engine}}",
        ),
    ]
    return out


def concrete(expr: str, window: str = "1m") -> str:
    """A panel's expression as Prometheus runs it with every variable at "All" (`.*`) and the
    rate interval, interval and range at `window`; `$x` and `${x}` (`${x:format}`) alike."""
    expr = re.sub(r"\$(?:__(?:rate_interval|interval|range)\b|\{__(?:rate_interval|interval|range)\})", window, expr)
    names = "|".join(VARIABLES)
    return re.sub(r"\$(?:(" + names + r")\b|\{(" + names + r")(?::[a-z]+)?\})", ".*", expr)


# --------------------------------------------------------------------------- boards
def dashboards(slo: SloClass) -> dict[str, dict[str, Any]]:
    """Each board's JSON model (uid -> dashboard), built with grafana-foundation-sdk."""
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    source = DataSourceRef(type_val="prometheus", uid="${datasource}")
    by_board: dict[str, list[Panel]] = {}
    for p in panels(slo):
        by_board.setdefault(p.board, []).append(p)
    out = {}
    for uid, title in BOARDS.items():
        board = (
            db.Dashboard(title)
            .uid(uid)
            .tags(["moemeter", "vllm"])
            .refresh("30s")
            .time("now-3h", "now")
            .timezone("utc")
            .with_variable(
                db.DatasourceVariable("datasource")
                .label("Prometheus")
                .type("prometheus")
                # the provisioned datasource by default
                .current(VariableOption(text=DATASOURCE_UID, value=DATASOURCE_UID, selected=True))
            )
        )
        for name in VARIABLES:
            board = board.with_variable(
                db.QueryVariable(name)
                .label(name)
                .datasource(source)
                .query(VARIABLE_QUERIES[name])
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                .multi(True)
                .include_all(True)
                .all_value(".*")
            )
        for p in by_board[uid]:
            query = prometheus.Dataquery().expr(p.expr).legend_format(p.legend or "__auto").ref_id("A")
            builder: Any
            if p.kind == "stat":
                builder = stat.Panel()
            elif p.kind == "heatmap":  # buckets as Prometheus counts them, not re-bucketed by Grafana
                builder = heatmap.Panel().calculate(False).y_axis(heatmap.YAxisConfig().unit(p.unit)).show_tooltip()
                query = query.format(PromQueryFormat.HEATMAP)
            else:
                builder = timeseries.Panel()
            builder = (
                builder.title(p.title)
                .description(p.text)
                .datasource(source)
                .unit(p.unit)
                .with_target(query)
                .span(4 if p.kind == "stat" else 12)
                .height(4 if p.kind == "stat" else 8)
            )
            board = board.with_panel(builder)
        out[uid] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return out


def board_panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a board's JSON model, those inside rows too."""
    for p in model.get("panels", []):
        yield p
        yield from p.get("panels", [])


# --------------------------------------------------------------------------- docs
def markdown_table(slo: SloClass) -> str:
    """docs/grafana.md's panel table."""
    lines = ["| Board | Panel | Expression | Unit | Plugin |", "| --- | --- | --- | --- | --- |"]
    for p in panels(slo):
        expr = p.expr.replace("|", "\\|")
        lines.append(f"| {p.board} | {p.title} | `{expr}` | {p.unit} | {'yes' if p.plugin else ''} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from datetime import UTC, datetime

    from warehouse.slo import default_slo_sheet

    slo = default_slo_sheet().default_at(datetime.now(UTC).replace(tzinfo=None))
    assert slo is not None, "the default SLO sheet has a default class"
    print(markdown_table(slo), end="")
