{{/* The release's full name: the release name, prefixed with the chart's unless it contains it. */}}
{{- define "webhook.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "webhook.labels" -}}
{{ include "webhook.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "webhook.serviceAccountName" -}}
{{- default (include "webhook.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "webhook.adminSecretName" -}}
{{- default (printf "%s-admin" (include "webhook.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}

{{- define "webhook.secretName" -}}
{{- default (printf "%s-env" (include "webhook.fullname" .)) .Values.token.existingSecret -}}
{{- end -}}

{{/*
The hooks of the values, checked and completed, as a JSON list (read back with fromJsonArray):
id, namespace, workload, kind, name, container, registryType, networkType, mailTo and tokenVar,
the environment variable holding the hook's token.
*/}}
{{- define "webhook.hooks" -}}
{{- $hooks := .Values.hooks -}}
{{- if .Values.hooksYaml -}}
{{- $hooks = fromYamlArray .Values.hooksYaml -}}
{{- end -}}
{{- $out := list -}}
{{- $ids := dict -}}
{{- $vars := dict -}}
{{- range $i, $h := $hooks -}}
{{- $at := printf "hooks[%d]" $i -}}
{{- range $key := list "namespace" "workload" "container" -}}
{{- if not (get $h $key) -}}
{{- fail (printf "%s.%s is required" $at $key) -}}
{{- end -}}
{{- end -}}
{{- $parts := splitList "/" $h.workload -}}
{{- $kind := lower (first $parts) -}}
{{- if or (ne (len $parts) 2) (not (has $kind (list "deployment" "daemonset" "statefulset" "cronjob"))) -}}
{{- fail (printf "%s.workload %q: use <kind>/<name>, kind deployment, daemonset, statefulset or cronjob" $at $h.workload) -}}
{{- end -}}
{{- $type := default "" $h.registryType -}}
{{- if and $type (not (has $type (list "regionalregistry" "publicregistry" "custom"))) -}}
{{- fail (printf "%s.registryType %q: use regionalregistry, publicregistry or custom (or leave it empty)" $at $type) -}}
{{- end -}}
{{- $net := default "" $h.networkType -}}
{{- if and $net (not (has $net (list "vpc" "internal"))) -}}
{{- fail (printf "%s.networkType %q: use vpc or internal (or leave it empty)" $at $net) -}}
{{- end -}}
{{- if and $h.helmRelease (ne (lower (toString $h.helmRelease)) "none") (eq $.Values.rbac.mode "cluster") $.Values.rbac.create -}}
{{- fail (printf "%s.helmRelease: the release's records are Secrets, which rbac.mode cluster does not grant; use rbac.mode namespaced" $at) -}}
{{- end -}}
{{- $id := default (printf "%s-%s" $h.namespace (last $parts)) $h.id -}}
{{- if hasKey $ids $id -}}
{{- fail (printf "%s.id %q: another hook has this id" $at $id) -}}
{{- end -}}
{{- $_ := set $ids $id true -}}
{{- $var := "HOOK_TOKEN" -}}
{{- if $.Values.token.perHook -}}
{{- $var = printf "HOOK_TOKEN_%s" (regexReplaceAll "[^A-Z0-9]" (upper $id) "_") -}}
{{- if hasKey $vars $var -}}
{{- fail (printf "%s.id %q: its token variable %s is another hook's too; choose another id" $at $id $var) -}}
{{- end -}}
{{- $_ := set $vars $var true -}}
{{- end -}}
{{- $out = append $out (dict "id" $id "namespace" $h.namespace "workload" $h.workload "kind" $kind "name" (last $parts) "container" $h.container "registryType" $type "networkType" $net "mailTo" (default "" $h.mailTo) "helmRelease" (default "" $h.helmRelease) "policy" (default (default "" $.Values.updatePolicy) $h.policy) "tokenVar" $var) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
One hook definition, the shape of the seed hook (deploy/hooks.yaml): /webhooks.sh with the
payload, the target from the URL, and a rule that accepts exactly the hook's token, namespace,
workload and container. The token is read when the file is loaded ({{ getenv "…" }}, -template).
*/}}
{{- define "webhook.hookDefinition" -}}
{{- $url := dict "source" "url" -}}
{{- $env := list (merge (dict "envname" "APP_NS" "name" "ns") $url) (merge (dict "envname" "APP_WORKLOAD" "name" "workload") $url) (merge (dict "envname" "APP_CONTAINER" "name" "container") $url) -}}
{{- if .registryType -}}
{{- $env = append $env (dict "envname" "REPO_TYPE" "source" "string" "name" .registryType) -}}
{{- else -}}
{{- $env = append $env (merge (dict "envname" "REPO_TYPE" "name" "repo_type") $url) -}}
{{- end -}}
{{- if .networkType -}}
{{- $env = append $env (dict "envname" "NET_TYPE" "source" "string" "name" .networkType) -}}
{{- else -}}
{{- $env = append $env (merge (dict "envname" "NET_TYPE" "name" "net_type") $url) -}}
{{- end -}}
{{- if .mailTo -}}
{{- $env = append $env (dict "envname" "MAIL_TO" "source" "string" "name" .mailTo) -}}
{{- end -}}
{{- if .policy -}}
{{- $env = append $env (dict "envname" "UPDATE_POLICY" "source" "string" "name" .policy) -}}
{{- end -}}
{{- if .helmRelease -}}
{{- $env = append $env (dict "envname" "HELM_RELEASE" "source" "string" "name" .helmRelease) -}}
{{- end -}}
{{- $match := list (list (printf "{{ getenv %q }}" .tokenVar) "token") (list .namespace "ns") (list .workload "workload") (list .container "container") -}}
{{- $rules := list -}}
{{- range $m := $match -}}
{{- $rules = append $rules (dict "match" (dict "type" "value" "value" (first $m) "parameter" (merge (dict "name" (last $m)) $url))) -}}
{{- end -}}
{{- $hook := dict "id" .id "execute-command" "/webhooks.sh" "command-working-directory" "/home" "response-message" "I got the payload!" "include-command-output-in-response" true "include-command-output-in-response-on-error" true "trigger-rule-mismatch-http-response-code" 500 -}}
{{- $_ := set $hook "response-headers" (list (dict "name" "Access-Control-Allow-Origin" "value" "*")) -}}
{{- $_ := set $hook "pass-arguments-to-command" (list (dict "source" "entire-payload")) -}}
{{- $_ := set $hook "pass-environment-to-command" $env -}}
{{- $_ := set $hook "trigger-rule" (dict "and" $rules) -}}
{{- list $hook | toPrettyJson -}}
{{- end -}}

{{/*
What the pod's environment and admin token are made from, random tokens aside: its hash restarts
the pod when it changes (the token file is read at start).
*/}}
{{- define "webhook.envChecksum" -}}
{{- $vars := list -}}
{{- range $h := include "webhook.hooks" . | fromJsonArray -}}
{{- $vars = append $vars $h.tokenVar -}}
{{- end -}}
{{- dict "vars" (uniq $vars) "token" .Values.token "mail" .Values.mail "adminToken" .Values.adminToken | toJson | sha256sum -}}
{{- end -}}
