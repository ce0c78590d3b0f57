# syntax=docker/dockerfile:1
# ebb's container image. Two variants, one per target:
#   docker build -t ebb:0.1.0 .                        CPU (the default, last stage): mocker, llama-cpp on CPU, openai
#   docker build --target cuda -t ebb:0.1.0-cuda .     + llama.cpp's CUDA 13 prebuilt on an NVIDIA CUDA runtime base
# Both run as a non-root user (uid 10001), ship only production dependencies, and keep only the
# node-llama-cpp prebuilt binaries their backends need (all of them are ~700 MB; CPU alone ~30 MB).
# Nothing is built or downloaded at run time. test/deploy-manifests.test.ts checks this file offline.

ARG NODE_IMAGE=node:20-slim
# node-llama-cpp 3.21.1's linux-x64-cuda prebuilt links libcudart.so.13 / libcublas.so.13: a CUDA 13
# runtime (the host driver must support CUDA 13, i.e. >= 580; the driver itself comes from the host).
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04

# --- compile: TypeScript to dist/, then the bundle dist/bin/ (dev dependencies, no llama.cpp prebuilts
# needed for that). esbuild's binary is an optional dependency too: its install script fetches the
# one for this platform when the optional package was omitted.
FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=optional --ignore-scripts --no-audit --no-fund && npm rebuild esbuild
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npx tsc -p tsconfig.build.json && node dist/src/build/precompile-validators.js && node dist/src/build/bundle.js

# --- production node_modules, all prebuilt binaries; each variant prunes to its own below
FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force

# Keeps the @node-llama-cpp/* packages named in LLAMA_PREBUILTS, removes the others.
FROM deps AS deps-cpu
ARG LLAMA_PREBUILTS="linux-x64 linux-arm64"
RUN for d in node_modules/@node-llama-cpp/*/; do \
      case " ${LLAMA_PREBUILTS} " in *" $(basename "$d") "*) ;; *) rm -rf "$d" ;; esac; \
    done

FROM deps AS deps-cuda
# linux-x64 stays for --gpu off; linux-x64-cuda-ext is the CUDA 12 fallback, which this CUDA 13 base cannot load.
ARG LLAMA_PREBUILTS="linux-x64 linux-x64-cuda"
RUN for d in node_modules/@node-llama-cpp/*/; do \
      case " ${LLAMA_PREBUILTS} " in *" $(basename "$d") "*) ;; *) rm -rf "$d" ;; esac; \
    done

# --- the CUDA variant: Node 20 (the binary from the Node image) on NVIDIA's CUDA runtime
FROM ${NODE_IMAGE} AS node
FROM ${CUDA_IMAGE} AS cuda
COPY --from=node /usr/local/bin/node /usr/local/bin/node
ENV NODE_ENV=production NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /app
COPY package.json ./
# src/ travels too: the dashboard's HTML is read from it at run time (a few hundred KB).
COPY src ./src
COPY --from=build /app/dist/src ./dist/src
COPY --from=build /app/dist/bin ./dist/bin
COPY --from=deps-cuda /app/node_modules ./node_modules
# `ebb` on the PATH: the worker's preStop hook runs `ebb prestop`.
RUN chmod 755 dist/bin/ebb.js && ln -s /app/dist/bin/ebb.js /usr/local/bin/ebb \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ebb
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["node", "/app/dist/bin/ebb.js"]
CMD ["up", "--host", "0.0.0.0"]

# --- the CPU variant (default target)
FROM ${NODE_IMAGE} AS cpu
ENV NODE_ENV=production
WORKDIR /app
COPY package.json ./
COPY src ./src
COPY --from=build /app/dist/src ./dist/src
COPY --from=build /app/dist/bin ./dist/bin
COPY --from=deps-cpu /app/node_modules ./node_modules
RUN chmod 755 dist/bin/ebb.js && ln -s /app/dist/bin/ebb.js /usr/local/bin/ebb \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ebb
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["node", "/app/dist/bin/ebb.js"]
CMD ["up", "--host", "0.0.0.0"]
