"""pulse from PyTorch: publish a training loop's weights, pull them into an
inference worker's tensors, in place, bit for bit (docs/guides/).

    pub = pulse.Publisher("/data/store")
    with pulse.Server("/data/store", listen="0.0.0.0:8080") as server:
        for batch in data:
            ...; opt.step()
            pub.publish(model.state_dict())

    sub = pulse.Subscriber("http://trainer:8080", key=pub.public_key)
    sub.pull(worker_model.state_dict())     # BF16 tensors, updated in place

A thin ctypes layer over libpulse.so (found through PULSE_LIBRARY, else
where pip or cmake --install put it, else in the checkout's build/), loaded
here: importing pulse fails with pulse.Error when the library is missing or
of another version than this package. Every loop over elements runs in C.
Torch is needed only once tensors are given.
"""

from ._lib import Error, lib as _libpulse
from ._version import __version__
from .mapping import Mapping
from .publisher import Publisher
from .server import Server
from .shard import Block
from .subscriber import Subscriber
from . import loco

_libpulse.load()

__all__ = ["Block", "Error", "Mapping", "Publisher", "Server", "Subscriber", "loco", "__version__"]
