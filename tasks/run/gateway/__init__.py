"""The model gateway (docs/agents.md, "Model gateway and keys"): one `RunChannel` per run, a Unix socket the sandbox
reaches at /run/forgehand/gateway.sock, with the run's token as its only credential. The real
provider keys stay on the host (`proxy`), usage is metered (`metering`) against the run's token
budget (`budget`), and tokens live only in this process (`tokens`)."""

from tasks.run.gateway.channel import SOCKET_NAME, KeySource, ProviderInfo, RunChannel, channel_name
from tasks.run.gateway.endpoint import Upstream
from tasks.run.gateway.metering import PriceTable, Usage, load_prices
from tasks.run.gateway.routes import HookHandler
from tasks.run.gateway.setup import ChannelUnavailable, build_channel, provider_of, sweep_channels
from tasks.run.gateway.tokens import REGISTRY, TokenRegistry

__all__ = [
    "REGISTRY",
    "SOCKET_NAME",
    "ChannelUnavailable",
    "HookHandler",
    "KeySource",
    "PriceTable",
    "ProviderInfo",
    "RunChannel",
    "TokenRegistry",
    "Upstream",
    "Usage",
    "build_channel",
    "channel_name",
    "load_prices",
    "provider_of",
    "sweep_channels",
]
