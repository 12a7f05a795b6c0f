#!/usr/bin/env bash
# pytorch/examples' dcgan/main.py (a GAN: a generator and a discriminator, two Adam optimizers, no torch.compile),
# unchanged, tuned end to end on its FakeData. For a machine without torchvision, the three names the script uses
# (datasets.FakeData, transforms.ToTensor, utils.save_image) come from a shim put on PYTHONPATH; the training loop is
# the script's own.
#
#   bash benchmarks/recipes/dcgan_study.sh EXAMPLES_GIT_DIR OUT_DIR [AUTOCOMPILE_ARGS...]
#
# EXAMPLES_GIT_DIR: a clone of github.com/pytorch/examples holding commit 77f55b9. Run it alone (uptime first).
set -euo pipefail
examples=$1 out=$(realpath -m "$2"); shift 2
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/dcgan/shim/torchvision"
git --git-dir="$examples" show 77f55b9:dcgan/main.py > "$out/dcgan/main.py" 2>/dev/null \
  || git -C "$examples" show 77f55b9:dcgan/main.py > "$out/dcgan/main.py"
cat > "$out/dcgan/shim/torchvision/__init__.py" <<'PY'
from . import datasets, transforms, utils  # noqa: F401
PY
cat > "$out/dcgan/shim/torchvision/datasets.py" <<'PY'
import torch


class FakeData(torch.utils.data.Dataset):
    """torchvision's FakeData: random images, each index seeded, as tensors."""

    def __init__(self, size=1000, image_size=(3, 224, 224), num_classes=10, transform=None, random_offset=0):
        self.size, self.image_size, self.num_classes, self.transform = size, image_size, num_classes, transform
        self.random_offset = random_offset

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index + self.random_offset)
        img = torch.rand(*self.image_size, generator=g)
        target = int(torch.randint(0, self.num_classes, (1,), generator=g))
        return (self.transform(img) if self.transform else img), target
PY
cat > "$out/dcgan/shim/torchvision/transforms.py" <<'PY'
class ToTensor:
    def __call__(self, x):
        return x
PY
cat > "$out/dcgan/shim/torchvision/utils.py" <<'PY'
def save_image(*args, **kwargs):
    """No image written: the training loop is what is measured."""
PY
cd "$out/dcgan"
PYTHONPATH="$out/dcgan/shim" python -m autocompile script.path=main.py \
  "script.args='--dataset fake --ngf 16 --ndf 16 --batchSize 16 --niter 30 --workers 2'" \
  output_root="$out/study" tracking.uri="sqlite:///$out/mlflow.db" "$@"
