# syntax=docker/dockerfile:1
#
# The webhook image: the single executable dist/webhook on an empty base, nothing else but what it
# needs at run time. ~156 MB unpacked (the executable is 150 MB of it), ~53 MB compressed.
#
#   docker build -t registry.example.com/ops/webhook:0.1.0 .      (or buildah bud, kaniko, …)
#
# This file is for builders that can pull node:26. Where nothing can be pulled and there is no
# Docker daemon (CI, air-gapped build hosts), `npm run image` (scripts/image.ts) builds this file's
# final stage with buildah into dist/webhook-image.tar, the build stage replaced by the same root
# filesystem written from this machine's dist/webhook (`--build-context build=<dir>`).

FROM node:26 AS build
WORKDIR /src
COPY package.json package-lock.json ./
# The devDependency `node` brings the pinned Node 26 itself; npm scripts put it first on PATH.
RUN npm ci --no-audit --no-fund
COPY tsconfig.json webhook.ts ./
COPY scripts/ scripts/
RUN npm run build
# The final image's root filesystem, from the files of this stage: the executable, the shared
# libraries `ldd` names for it (glibc, libstdc++, libgcc_s, libatomic and the dynamic loader),
# the CA certificates, /etc/passwd and /etc/group with the user webhook (65532), nsswitch.conf,
# /webhooks.sh, /etc/webhook/source, /home and /tmp. See writeRootfs in scripts/image.ts.
RUN node scripts/image.ts rootfs /rootfs

FROM scratch
# No shell and no package manager. The old image needed bash (plus jq, kubectl and curl) only for
# its /webhooks.sh script; here /webhooks.sh is a symlink to the executable, which runs the upgrade
# when started under that name (and the runner, recognising it, runs the upgrade in-process), so
# nothing in the image needs a shell. Hooks that run other programs need an image built FROM this
# one that adds them.
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# glibc's malloc gives blocks of 64 KiB and more (socket reads, answers from the API server) their own
# mappings, returned when freed, instead of its heap, which keeps what it once held: in a 2,000-push
# release that heap peaked at 57 MB instead of 122 MB (docs/results.md#2000-workloads).
ENV MALLOC_MMAP_THRESHOLD_=65536
WORKDIR /
# Works with a read-only root filesystem: nothing is written at run time except by
# pass-file-to-command, which writes its temp files to the hook's working directory, else to
# $TMPDIR or /tmp; the Deployment (deploy/) mounts an emptyDir at /tmp. (/home, the seed hook's
# working directory, is then read-only: the seed hook passes no files.)
USER 65532:65532
EXPOSE 9000
ENTRYPOINT ["/usr/local/bin/webhook"]
# What the old image's start script did. The executable itself appends $WEBHOOK_CMD (the old
# image's way to add -template) and decodes MAIL_CACERT, so no start script is needed.
CMD ["-hooks", "/etc/webhook/source", "-hotreload", "-verbose"]
LABEL org.opencontainers.image.title="webhook" \
      org.opencontainers.image.description="Image-push webhook receiver (adnanh/webhook drop-in) that upgrades Kubernetes workloads"
