"""Optional learned role head: x_q -> A, M(delta) and the objective/cost weights (see ``model``)."""
from .model import HeadError, LEARNED_WEIGHTS, RoleHead, load_head, save_head


def train_head(*args, **kwargs):
    """See ``trawmem_gpu.head.train.train_head`` (imported lazily: it pulls in tqdm and the encoder)."""
    from .train import train_head as _train

    return _train(*args, **kwargs)


__all__ = ["HeadError", "LEARNED_WEIGHTS", "RoleHead", "load_head", "save_head", "train_head"]
