/*
 * The settings tables of docs/configuration.md, written from HOOK_SETTINGS, the one table of the settings of the
 * upgrade, its mail and its notifications (webhook.ts, chapter "hook settings"): one line per setting (its type,
 * default, validation and meaning), and "In detail", what each hook setting does at length (SETTING_DETAILS
 * below, which must name every hook setting of the table and nothing else). `node scripts/docs.ts` writes them
 * with the other generated parts of the docs (running this file does the same);
 * test/settings.test.ts and test/docs.test.ts fail when the document and the table disagree.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HOOK_SETTINGS, REPO_TYPES, type HookSetting } from '../webhook.ts';

/** A table cell: pipes escaped, so a value never splits the row. */
function cell(text: string): string {
  return text.replaceAll('|', '\\|');
}

function rows(from: HookSetting<unknown>['from']): string[] {
  const header = ['| Name | Type | Default | Fixed string | Validation | Meaning |', '|---|---|---|---|---|---|'];
  const entries = Object.entries(HOOK_SETTINGS) as [string, HookSetting<unknown>][];
  const lines = entries
    .filter(([, s]) => s.from === from)
    .map(([name, s]) => {
      const fixed = s.fixed ? 'yes' : 'no';
      return `| \`${name}\` | ${cell(s.type)} | ${cell(s.default)} | ${fixed} | ${cell(s.validation)} | ${cell(s.meaning)} |`;
    });
  return [...header, ...lines];
}

export const CONFIGURATION = path.join(import.meta.dirname, '..', 'docs', 'configuration.md');
export const BEGIN = '<!-- BEGIN settings: written from HOOK_SETTINGS by `node scripts/docs.ts`; do not edit -->';
export const END = '<!-- END settings -->';

/** The generated part of docs/configuration.md, markers included. */
export function settingsSection(): string {
  return [
    BEGIN,
    '',
    '### Per hook',
    '',
    'Environment variables a hook passes to `/webhooks.sh` (`pass-environment-to-command`). A setting',
    'marked "fixed string" widens what a request may do, so the hook must give it as',
    '`{"source": "string", "envname": …, "name": <value>}`: a hooks file that takes it from the request,',
    'or gives a value that fails its validation, is refused when it loads. `-validate` lists, for each',
    'hook, the settings it passes with their type, default and meaning.',
    '',
    ...rows('hook'),
    '',
    "### The service's environment",
    '',
    "The service's own environment (the Deployment's `env`); the MAIL_* values other than the port, the",
    'TLS mode and the switches are base64, as the old image took them. A malformed MAIL_* value turns',
    'mail off and is logged at start (hooks keep working); a NOTIFY_CACERT that holds no certificate',
    'stops the start-up (exit 1), naming it.',
    '',
    ...rows('service'),
    '',
    END,
  ].join('\n');
}

/** The registries of REPO_TYPE that have a name besides their key: the three the old image knew, and auto. */
const REPO_TYPE_NAMES: Record<string, string> = {
  regionalregistry: 'Aliyun ACR',
  publicregistry: 'Docker Hub',
  custom: 'a build job',
  auto: 'recognised from the payload',
};

const repoTypeList = REPO_TYPES.map((t) => (REPO_TYPE_NAMES[t] ? `\`${t}\` (${REPO_TYPE_NAMES[t]})` : `\`${t}\``)).join(', ');

/**
 * What each hook setting does, at length, for the "In detail" table (the tables above say it in one line).
 * Markdown; links are relative to docs/. Every hook setting of HOOK_SETTINGS has one, and nothing else.
 */
export const SETTING_DETAILS: Record<string, string> = {
  APP_NS:
    'Namespace of the workload to upgrade. Also what `-print-rbac` reads (a literal, or a parameter a `value` rule pins).',
  APP_WORKLOAD:
    '`<kind>/<name>`: `deployment`, `daemonset`, `statefulset`, `cronjob`, case-insensitive, plurals and ' +
    '`deploy`/`ds`/`sts`/`cj` too.',
  APP_CONTAINER: "The container's exact name (containers, then init containers).",
  CLUSTER:
    'The kubeconfig context whose cluster the workload is in (the kubeconfig of `-kubeconfig` or ' +
    '`KUBECONFIG`, read as kubectl reads it); unset, the current context, or the pod\'s service account. A request ' +
    'never chooses a cluster. See [A hook names its cluster](clusters.md#a-hook-names-its-cluster).',
  CLUSTERS:
    'Several contexts, separated by spaces (at most 16): one delivery fanned out, the workload ' +
    'upgraded in each cluster at once, each with its own result, record, rollout follow and Event; answered 200 ' +
    'when every cluster applied it, 202 when one is kept. Not together with `CLUSTER`. See ' +
    '[Several clusters](clusters.md). With `>` between them, stages (at most 8): `staging > prod-eu prod-us` ' +
    'applies a push to `staging` only, and the digest that ran there to `prod-eu` and `prod-us` once it stayed ' +
    'healthy for `PROMOTE_AFTER`; an item may name a namespace, `staging/shop-staging`. See ' +
    '[Promotion](promotion.md).',
  PROMOTE_AFTER:
    'CLUSTERS stages: how long a stage\'s rollout must stay healthy (complete, the same image, no pod restart, not ' +
    'rolled back) before the digest that ran there is pushed to the next stage. A Go duration, `0s` (the default: ' +
    'as soon as the rollout completes) to `168h`. See [Promotion](promotion.md).',
  PROMOTE_CHECK:
    'CLUSTERS stages: an `https` URL asked with a GET once the soak has passed; anything but a 2xx (after 3 tries ' +
    'with backoff, 10 s each, 30 s in all) stops the chain at that stage. No user or password in it: it is logged. ' +
    'See [Promotion](promotion.md).',
  REPO_TYPE:
    `How to read the payload: ${repoTypeList}. See [registries.md](registries.md).`,
  NET_TYPE:
    'ACR only: `vpc` → `registry-vpc.…`, `internal` → `registry-internal.…`. Not used when `REGISTRY_HOST` is set.',
  REGISTRY_HOST:
    '`host[:port]` that replaces the registry host of every push, whatever the `repo_type`: the ' +
    'computed ACR host for `regionalregistry` (ACR Enterprise Edition `<instance>-registry[-vpc].<region>.cr.aliyuncs.com`, ' +
    'Personal Edition `crpi-<id>[-vpc].<region>.personal.cr.aliyuncs.com`; `net_type` is then not used), Docker Hub ' +
    'for `publicregistry` (a mirror of it), `repo_url` for `custom`; required for `jfrog` and `nexus`, and for ' +
    '`harbor` when Harbor has no external URL. The image pin counts it as the container\'s own registry, so a hook ' +
    'can move a workload to it (same repository path).',
  PIN_DIGEST:
    '`true`: when the payload carries the pushed digest (ACR, Harbor and Artifactory do), deploy `repo:tag@sha256:…`.',
  UPDATE_POLICY:
    'Which tags a push may deploy: `all`, `semver:<range>` (npm ranges: `^1.4`, `~1.4.2`, ' +
    '`>=1.4.0 <2.0.0`, `1.x`), `major`, `minor`, `patch` (Keel\'s meaning, relative to the running version; the ' +
    'semver policies never go down unless `,allow-downgrade` follows), `glob:<pattern>`, `regexp:<pattern>`. The ' +
    'workload\'s annotations `webhook/policy` and `webhook/policy.<container>` override it. See ' +
    '[policies.md](policies.md).',
  ALLOW_IMAGES:
    'Repositories the hook may deploy besides the container\'s own, space-separated: `host/path` ' +
    '(exactly that repository), `host/path/*` (every repository under `host/path`, at any depth), `host/*` (every ' +
    'repository of that registry). Docker Hub\'s may omit the host (`nginx` is `docker.io/library/nginx`, ' +
    '`shopteam/*`). Compared like the pin: host case-insensitive, endpoints of one registry alike ' +
    '(`registry.cn-hangzhou.aliyuncs.com/shop/*` also allows `registry-vpc.…/shop/x`). Tags and digests are never ' +
    'named (they are always free); a `*` anywhere but a trailing `/*`, a tag, a bare host or an invalid name is a ' +
    'load error naming file, line and field. Example: `{"envname": "ALLOW_IMAGES", "source": "string", "name": ' +
    '"registry.cn-hangzhou.aliyuncs.com/shop/* nginx"}`.',
  VERIFY_IMAGE:
    '`true`: before the patch, ask the registry what the tag is (see [Verifying the pushed ' +
    'image](registries.md#verifying-the-pushed-image-verify_image)) and deploy `repo:tag@sha256:…`; a missing tag ' +
    'or another digest than the payload\'s is refused.',
  REGISTRY_CA:
    'With `VERIFY_IMAGE`: the CA (PEM text, or a PEM file\'s path) that signed a private registry\'s certificate, ' +
    'trusted in addition to Node\'s default set (bundled roots, `NODE_EXTRA_CA_CERTS`), as `NOTIFY_CACERT` and ' +
    '`MAIL_CACERT` are.',
  REGISTRY_TOKEN_HOSTS:
    'With `VERIFY_IMAGE`: token services, besides the registry\'s own host and the well-known ones ' +
    '(see [where the pull secret\'s login goes](registries.md#where-the-pull-secrets-login-goes)), that may be given ' +
    'the pull secret\'s login; host names separated by spaces, `*.example.com` for any sub-domain, no scheme, no port.',
  VERIFY_SIGNATURE:
    '`cosign:<key>` items separated by spaces, each the PEM text of public keys or a PEM file\'s path ' +
    '(ECDSA P-256, Ed25519 or RSA, as `cosign generate-key-pair` writes `cosign.pub`): deploy only a digest with a ' +
    'cosign signature valid under one of them, read offline from the registry. Implies `VERIFY_IMAGE`. A key that ' +
    'is not one (a private key, another curve, a file that cannot be read) is a load error naming file, line and ' +
    'field. See [Signed images](security.md#signed-images).',
  VERIFY_SIGNATURE_ANNOTATIONS:
    'With `VERIFY_SIGNATURE`: `key=value` items separated by spaces that a signature must carry ' +
    '(`cosign sign -a key=value`), e.g. `pipeline=release`.',
  SIGNATURE_WAIT:
    'With `VERIFY_SIGNATURE`: how long a push whose digest has no signature yet (CI pushes, then signs) waits for ' +
    'it, answered 202 (`waiting for its signature until <time>`, decision `waiting: signature`). It is looked at ' +
    "again when the signature's own push (tag `sha256-<hex>.sig`, or the referrers index `sha256-<hex>`) arrives, " +
    'at each look of a registry watch, every ' +
    'minute and when the wait ends; then deployed, or refused (`refused: unsigned`). `0` refuses at once; else ' +
    '10s to 24h. A signature by another key, copied from another digest, or a tag moved is refused at once. See ' +
    '[Signed images](security.md#signed-images).',
  ON_REGISTRY_AWAY:
    'With `VERIFY_IMAGE` or `VERIFY_SIGNATURE`, when the registry cannot be reached: `fail` (the ' +
    'default) answers 500 and changes nothing; `keep` answers 202, keeps the push and tries it again every 5 s (the ' +
    'tag resolved and its signature checked anew), applying it once the registry answers, within ' +
    '`-apply-deadline`. See [While the API server is away](upgrade.md#while-the-api-server-is-away).',
  POLL_INTERVAL:
    'A hook that fixes its workload (`APP_NS`, `APP_WORKLOAD`) watches that workload\'s registry this often: a new ' +
    'tag its update policy allows, or its tag moved to another digest, is deployed as a push would be. The ' +
    'annotation `webhook/poll` asks the same of one workload. See [Registries that cannot ' +
    'call](registries.md#registries-that-cannot-call).',
  ANNOTATION_NAMESPACES:
    'The namespaces whose workloads may name this hook in the annotation `webhook/hook` (the registry watch), ' +
    'separated by spaces or commas, or `*` for every namespace. Unset, only the workload the hook fixes (`APP_NS` ' +
    'and `APP_WORKLOAD`) may: a hook that leaves its namespace or workload to the request is never reached by an ' +
    'annotation unless it lists the namespace. It widens nothing the hook fixes (its namespace, workload, ' +
    'container, clusters and stages stay constraints). See [The gate](security.md#the-gate-who-may-deploy-what-where).',
  ON_OUTSIDE_CHANGE:
    '`hold`: once the container\'s image was changed outside webhook (`kubectl set image`, ' +
    '`kubectl rollout undo`, Helm, Argo CD, Rancher), a push is applied only when strictly newer than the image ' +
    'replaced (semver, else pushed after the change), and otherwise answered `none (held: …)`; `follow`: every push ' +
    'is applied, whoever changed the image. See [A change made outside webhook is ' +
    'respected](upgrade.md#a-change-made-outside-webhook-is-respected).',
  REQUIRE_APPROVAL:
    '`true`: every push of the hook waits, recorded on the workload and answered 202, until a person ' +
    'approves or rejects it through the links in its notifications or on the deliveries page; the annotation ' +
    '`webhook/approval: required` asks the same of one workload. Needs `-public-url` and `-approval-key-file`. ' +
    'See [Approvals and change windows](approvals.md).',
  APPROVAL_TIMEOUT:
    'How long a waiting push may wait (a Go duration of at least `1m`; default `24h`): then its ' +
    'pending entry is taken off and it is reported `expired`.',
  DEPLOY_WINDOW:
    'One or more ranges separated by `;`, each `<days> <HH:MM>-<HH:MM> [<IANA zone>]` (e.g. ' +
    '`Mon-Fri 09:00-18:00 Asia/Shanghai`): a push outside the window is answered 202 and applied when it opens. ' +
    'The annotation `webhook/window` overrides it. See [Change windows](approvals.md#change-windows).',
  MIN_IMAGE_AGE:
    'How old an image must be before it is deployed, a Go duration (`72h`; `0`, the default, takes any; at most ' +
    '`2160h`): a push whose image is younger waits on the workload, answered 202 (decision `waiting: age`), and is ' +
    'deployed when it comes of age, by whichever replica sees it first, as any push would be then (an approval or a ' +
    'change window may still hold it); a newer push replaces it. Its age counts from when the image was built (its ' +
    "config's `created`) where the registry is asked (a registry watch, `VERIFY_IMAGE`), else from the push's time. " +
    'A registry watch passes over tags this young until they are not. The annotation `webhook/min-age` overrides it. ' +
    'See [A minimum image age](policies.md#a-minimum-image-age).',
  APPROVAL_OVERRIDE:
    '`true`: the approval of a push waiting for the change window may deploy it at once: its ' +
    'notification also offers **Deploy now**. Needs `-public-url` and `-approval-key-file`.',
  DRY_RUN:
    '`true`: each push is decided exactly as it would be (pin, signature, policy, hold, approval, window) and ' +
    'told as what it would do, in the answer, the mail, the chat and JSON (`dry_run: true`) and on the deliveries ' +
    'page: `would set app\'s image to …; dry run`. Nothing is written: no PATCH, no commit, no pending entry, no ' +
    'rollout followed; one Event `DryRun` on the workload says what it would have done. `-validate` lists the ' +
    'hook as a dry run. For trying a new hook, policy, chain or Git target on production first.',
  ROLLOUT_TIMEOUT:
    'A Go duration (`60s`): the answer waits this long for the rollout and fails if it fails or does not finish. ' +
    '`0`: the answer comes back once the patch is applied and the rollout is followed afterwards ' +
    '(`-rollout-follow`).',
  ROLLOUT_STUCK_TIMEOUT:
    'A Go duration from `1s` to `1h` (default `30s`): a new pod stuck this long (CrashLoopBackOff, ImagePullBackOff, ' +
    'ErrImagePull, CreateContainerConfigError) fails the followed rollout, in the answer\'s wait, in the follow after ' +
    'it and in a follow another replica resumes; under `ROLLBACK_ON_FAILURE` it is then rolled back.',
  ROLLBACK_ON_FAILURE:
    '`true`: a followed rollout that fails is rolled back to the image the container ran before the push (see ' +
    '[Rollback](upgrade.md#rollback)); a StatefulSet\'s stuck pods are then deleted for its forced rollback, which ' +
    'needs `delete` on pods: `-print-rbac` grants it only to hooks that fix the setting.',
  MAIL_TO:
    'Recipients of the result mail, comma-separated. Must come from the hook: a `MAIL_TO` in the service\'s own ' +
    'environment is not passed on. Mail goes out only when the service has a mail server (`MAIL_SMTP_SERVER`, ' +
    'below); without one, `-validate` warns for each hook that sets `MAIL_TO`. See [Mail](notifications.md#mail).',
  GIT_REPO:
    'The Git repository (`https://`; `http://` only for a loopback host) that a GitOps tool (Fleet, Argo CD, Flux) ' +
    'deploys the workload from. Set, an applied push is committed there instead of patched: the decision is made ' +
    'on the workload as read, exactly as without it, and the answer says `committed <sha> to <branch> of <repo>`. ' +
    'See [gitops.md](gitops.md).',
  GIT_BRANCH: 'The branch commits go to (default `main`); a branch moved by someone else is fetched again and the edit made again.',
  GIT_PATH:
    'The file edited, relative to the repository root: a `kustomization.yaml` (its `images:` entry named as the ' +
    "pushed repository: `newTag`, `digest` when pinned; added when missing), a Helm values file (with `GIT_FIELD`), or " +
    "a manifest (the document of the hook's kind and name, its container's `image`). Only that scalar's text changes.",
  GIT_FIELD:
    "A Helm values file's tag field (`image.tag`); a `repository` (and `registry`) beside it must name the pushed " +
    'repository, or the push is refused.',
  GIT_TOKEN:
    'The token: from the environment through `-template`, or the path of a file holding it (starting with `/`). ' +
    'Sent as basic auth; never logged or answered.',
  GIT_USERNAME: "Basic auth's user: `x-access-token` (GitHub app tokens; GitLab and Gitea accept it), `oauth2` for GitLab.",
  GIT_CA: "The CA that signed the Git server's certificate (PEM or a file), added to the system's.",
  GIT_SYNC_TIMEOUT:
    'After a commit is answered, how long the service waits for the GitOps tool to apply it (the workload runs the ' +
    'committed image; watched, or read every 2 s where the watch is refused); then the rollout is followed as after ' +
    'a PATCH (`-rollout-follow`) and its result reported with which tool applied it and when. Past it, the rollout ' +
    'is reported timed out. `0`: not waited for.',
  GIT_AUTHOR: 'The author and committer of the commits, `Name <email>`.',
  ON_GITOPS_OWNER:
    "Without `GIT_REPO`: `refuse` (the default) answers a push whose decision would patch a workload Argo CD, Flux " +
    "or Fleet deploys (their labels and annotations) with a refusal naming the tool, since its next " +
    'sync would undo the PATCH; `patch` patches it anyway. See [gitops.md](gitops.md).',
  GIT_PULL_REQUEST:
    'For a branch that refuses direct pushes (branch protection, review rules): `github`, `gitlab`, `gitea` ' +
    '(`forgejo`), `bitbucket` or `azure`. The commit goes to a branch of the container\'s own, ' +
    '`webhook/<namespace>/<kind>-<name>/<container>`, made on `GIT_BRANCH`\'s head, and a request into ' +
    '`GIT_BRANCH` is opened over the forge\'s REST API, or the open one updated: a newer push replaces the commit ' +
    'of the open request. The answer, the Event and the record link it; its merge is followed as a commit is ' +
    '(`GIT_SYNC_TIMEOUT`). See [gitops.md](gitops.md#pull-requests).',
  GIT_API:
    "The forge's REST API base, where it is not the usual one of `GIT_REPO`'s host (`https://api.github.com` for " +
    'github.com, `<host>/api/v3` for GitHub Enterprise, `<host>/api/v4` for GitLab, `<host>/api/v1` for Gitea, ' +
    '`https://api.bitbucket.org/2.0`, `https://dev.azure.com`).',
  HELM_RELEASE:
    'A workload a Helm release installed is upgraded in its release, as `helm upgrade --reuse-values --set ' +
    '<HELM_FIELD>=<tag>` would: the next revision (the Secret `sh.helm.release.v1.<name>.v<N+1>`), then the PATCH, ' +
    'then the revision deployed and the one before superseded. Unset: the workload\'s `meta.helm.sh/release-name` ' +
    'names the release, and a release the service cannot write (no `list`/`create` on Secrets, a values layout ' +
    'without the field) is left alone and the workload patched, with a note in the answer. `auto`: the same ' +
    'release, but such a push is refused and nothing is written. A name: that release of the hook\'s namespace. ' +
    '`none`: patched alone, as before. See [gitops.md](gitops.md#helm-releases).',
  HELM_FIELD:
    "The release values' tag field (`image.tag`), set in the user-supplied values as `--set` sets it; a " +
    '`repository` (and `registry`) beside it must name the pushed repository, a `digest` beside it gets the pinned ' +
    'digest (else a pinned digest follows the tag: `v1.2@sha256:…`). Setting it makes the hook ask for the release.',
  GIT_SIGNING_KEY:
    'An unencrypted OpenSSH ed25519 private key (PEM text or a file) that signs each commit as `git commit -S` with ' +
    '`gpg.format=ssh` does; `git verify-commit` accepts it with an allowed-signers file naming its public key.',
  NOTIFY_ON_SKIP:
    '`false`: a push the update policy skipped is not mailed or posted (it is still on the ' +
    'deliveries page and in the log). See [Skipped pushes](policies.md#skipped-pushes).',
  NOTIFY_URL:
    'One or more `https://` (or `http://`) URLs, separated by spaces or commas (at most 5). See ' +
    '[notifications.md](notifications.md#chat-and-json-notifications).',
  NOTIFY_FORMAT:
    '`json`, `dingtalk`, `wecom`, `feishu`, `slack`, `teams`, `discord`, `googlechat`, `telegram` or `lark`: one ' +
    'for every URL, or one per URL, comma-separated. See [the formats](notifications.md#chat-and-json-notifications).',
  NOTIFY_SECRET:
    'Signs the requests: the JSON signature header, DingTalk\'s signed URL, Feishu\'s and Lark\'s signed body. ' +
    'One for every URL, or one per URL, space-separated. The other formats sign nothing; a secret for them is ' +
    'an error.',
  NOTIFY_TELEGRAM_CHAT:
    'The chat a `telegram` URL posts in: its numeric id (groups and channels are negative, `-100…`) or a public ' +
    'channel\'s `@username`. One for every `telegram` URL, or one per `telegram` URL in order. Required with ' +
    '`NOTIFY_FORMAT=telegram`; an error without it. See [Telegram](notifications.md#telegram--notify_formattelegram).',
};

export const DETAILS_BEGIN =
  '<!-- BEGIN setting details: written from HOOK_SETTINGS and SETTING_DETAILS (scripts/settings-doc.ts) by ' +
  '`node scripts/docs.ts`; do not edit -->';
export const DETAILS_END = '<!-- END setting details -->';

const fixedOf = (name: string): string => ((HOOK_SETTINGS as Record<string, HookSetting<unknown>>)[name].fixed ? 'yes' : 'no');

/** The "In detail" table of docs/configuration.md, markers included; throws when it and HOOK_SETTINGS disagree. */
export function settingDetailsSection(): string {
  const hookSettings = (Object.entries(HOOK_SETTINGS) as [string, HookSetting<unknown>][])
    .filter(([, s]) => s.from === 'hook')
    .map(([name]) => name);
  const missing = hookSettings.filter((n) => !Object.hasOwn(SETTING_DETAILS, n));
  const extra = Object.keys(SETTING_DETAILS).filter((n) => !hookSettings.includes(n));
  if (missing.length || extra.length)
    throw new Error(
      `scripts/settings-doc.ts: SETTING_DETAILS ${missing.length ? `lacks ${missing.join(', ')}` : ''}` +
        `${missing.length && extra.length ? ' and ' : ''}${extra.length ? `names no hook setting: ${extra.join(', ')}` : ''}`,
    );
  return [
    DETAILS_BEGIN,
    '',
    '### In detail',
    '',
    'Fixed: the hook must give it as `{"source": "string", …}`; a hooks file that takes it from the request, or',
    'gives a value that fails its validation, is refused when it loads.',
    '',
    '| Variable | Fixed | Meaning |',
    '|---|---|---|',
    ...hookSettings.map((n) => `| \`${n}\` | ${fixedOf(n)} | ${cell(SETTING_DETAILS[n])} |`),
    '',
    DETAILS_END,
  ].join('\n');
}

/** The generated part as docs/configuration.md holds it now. */
export function documentedSection(text = fs.readFileSync(CONFIGURATION, 'utf8')): string {
  const from = text.indexOf(BEGIN);
  const to = text.indexOf(END);
  if (from < 0 || to < from) throw new Error(`${CONFIGURATION}: no ${BEGIN} … ${END} part`);
  return text.slice(from, to + END.length);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  // Imported here, not above: scripts/docs.ts imports this file.
  const { writeGeneratedParts } = await import('./docs.ts');
  writeGeneratedParts();
}
