# The image of the Kubernetes work pool's flow runs (prefect.yaml `retrain-k8s`, deploy/k8s/base-job-template.json):
# the project installed on Python 3.11 at the versions of constraints.txt (PyTorch's CPU wheel at its pin), run from
# /opt/decision-pipeline as an unprivileged user. Build it from the project root and tag it for your registry:
#   docker build -t decision-pipeline:0.1.0 --build-arg GIT_COMMIT=$(git rev-parse HEAD) .
# For CUDA nodes, pass the CUDA wheel index of the same torch version: --build-arg TORCH_INDEX_URL=.../whl/cu128
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Extras for the pod: dvc-s3 reaches an S3 DVC remote (the MLflow and Prefect servers run elsewhere).
ARG EXTRAS=s3
ARG GIT_COMMIT=unknown

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DVC_NO_ANALYTICS=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false

# git: DVC works inside a git repository (see the last step); nothing else is needed from Debian.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/decision-pipeline

# torch first and from its own index (constraints.txt's pin): from PyPI it would be a multi-GB CUDA build.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

# The library, then its dependencies at the tested versions (a layer that changes only with them or the code).
COPY pyproject.toml constraints.txt README.md ./
COPY pipeline/ pipeline/
COPY flows/ flows/
RUN pip install -c constraints.txt ".[${EXTRAS}]"

# What the stages and the flow read at run time: params, run configs, the DVC pipeline and its pins, the raw
# archive the dataset stage builds from, the deployment file, and the store's README (mlflow/ stays empty).
COPY params.yaml dvc.yaml dvc.lock prefect.yaml .dvcignore ./
COPY configs/ configs/
COPY .dvc/config .dvc/config
COPY data/raw/ data/raw/
COPY mlflow/README.md mlflow/README.md

# DVC needs a repository with one commit (as `make repo` gives an archive): a snapshot commit naming the source
# commit, owned by the user the pods run as (uid 1000, as the base job template's securityContext says).
RUN useradd --create-home --uid 1000 decision \
    && mkdir -p data/processed data/snapshots \
    && git init -q \
    && git add -A \
    && git -c user.name=decision-pipeline -c user.email=pipeline@localhost commit -qm "image of ${GIT_COMMIT}" \
    && chown -R decision:decision /opt/decision-pipeline
USER decision
LABEL org.opencontainers.image.revision="${GIT_COMMIT}" org.opencontainers.image.title="decision-pipeline"

# The Kubernetes worker sets the command of each flow run's pod (`prefect flow-run execute`); this is for a shell.
CMD ["decision", "--help"]
