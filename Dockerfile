# ebb's container image, CPU variant (mocker, llama-cpp on CPU, --engine openai):
#   docker build -t ebb:0.1.0 .
# The CUDA variant is Dockerfile.cuda, a file of its own: the legacy builder (Debian's docker.io,
# DOCKER_BUILDKIT=0) builds every stage of a file in order and pulls every FROM, so this file names
# no image the CPU image does not run on. No `# syntax=` line either: BuildKit would pull that
# frontend image from a registry; the builtin one reads this file.
# Build args: NODE_IMAGE (a Node 20 base: node:20-slim, or one deploy/docker/make-base-image.sh makes
# from Debian packages where no registry is reachable), NPM_REGISTRY (a mirror), NPM_CA (PEM text of
# the CA that signs the mirror's or a TLS-intercepting proxy's certificate).
# It runs as a non-root user (uid 10001), ships only production dependencies, and keeps only the
# node-llama-cpp prebuilt binaries its backends need (all of them are ~700 MB; CPU alone ~30 MB).
# Nothing is built or downloaded at run time. test/deploy-manifests.test.ts checks this file offline,
# and that Dockerfile.cuda's build and dependency stages are this file's.

ARG NODE_IMAGE=node:20-slim

# --- npm as the build args say, for the stages that install packages (the image itself has none of it)
FROM ${NODE_IMAGE} AS npm
ARG NPM_REGISTRY=
ARG NPM_CA=
RUN if [ -n "$NPM_REGISTRY" ]; then npm config set --global registry "$NPM_REGISTRY"; fi \
 && if [ -n "$NPM_CA" ]; then printf '%s\n' "$NPM_CA" > /usr/local/etc/npm-ca.pem \
      && npm config set --global cafile /usr/local/etc/npm-ca.pem; fi

# --- compile: TypeScript to dist/, then the bundle dist/bin/ (dev dependencies, no llama.cpp prebuilts
# needed for that). esbuild's binary is an optional dependency too: its install script fetches the
# one for this platform when the optional package was omitted.
FROM npm AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=optional --ignore-scripts --no-audit --no-fund && npm rebuild esbuild
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npx tsc -p tsconfig.build.json && node dist/src/build/precompile-validators.js && node dist/src/build/bundle.js

# --- production node_modules, pruned to the @node-llama-cpp/* prebuilt packages named in LLAMA_PREBUILTS
FROM npm AS deps
WORKDIR /app
COPY package.json package-lock.json ./
ARG LLAMA_PREBUILTS="linux-x64 linux-arm64"
# No `npm cache clean`: this stage's cache never reaches the image (only node_modules is copied), and
# npm answers --force with a warning a user must learn to ignore.
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
 && for d in node_modules/@node-llama-cpp/*/; do \
      case " ${LLAMA_PREBUILTS} " in *" $(basename "$d") "*) ;; *) rm -rf "$d" ;; esac; \
    done

# --- the CPU image (the default target: the last stage)
FROM ${NODE_IMAGE} AS cpu
ENV NODE_ENV=production
WORKDIR /app
COPY package.json ./
# src/ travels too: the dashboard's HTML is read from it at run time (a few hundred KB).
COPY src ./src
COPY --from=build /app/dist/src ./dist/src
COPY --from=build /app/dist/bin ./dist/bin
COPY --from=deps /app/node_modules ./node_modules
# `ebb` on the PATH: the worker's preStop hook runs `ebb prestop`.
RUN chmod 755 dist/bin/ebb.js && ln -s /app/dist/bin/ebb.js /usr/local/bin/ebb \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ebb
USER 10001:10001
EXPOSE 8000 8001
ENTRYPOINT ["node", "/app/dist/bin/ebb.js"]
CMD ["up", "--host", "0.0.0.0"]
