{{/* Names: the release name, or release-chart when the release name does not hold the chart's. */}}
{{- define "llm-gate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "llm-gate.vllmNamespace" -}}
{{- .Values.vllm.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* Labels on every object; helm.sh/chart and managed-by are Helm's own (kustomize's copy drops them). */}}
{{- define "llm-gate.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: llm-gate
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: call with (list $ "gate") or (list $ "scheduler" "primary"). */}}
{{- define "llm-gate.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- if gt (len .) 2 }}
llm-gate/pool: {{ index . 2 }}
{{- end }}
{{- end -}}

{{- define "llm-gate.image" -}}
{{- $i := .Values.image -}}
{{- $repo := ternary $i.repository (printf "%s/%s" $i.registry $i.repository) (empty $i.registry) -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $repo $i.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo ($i.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "llm-gate.schedulerName" -}}
{{- printf "%s-scheduler-%s" (include "llm-gate.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{/* An mTLS identity: call with (list $ namespace serviceAccount). */}}
{{- define "llm-gate.principal" -}}
{{- printf "%s/ns/%s/sa/%s" (index . 0).Values.istio.trustDomain (index . 1) (index . 2) -}}
{{- end -}}

{{- define "llm-gate.apiKeysDir" -}}/etc/llm-gate/secrets/api-keys{{- end -}}

{{/*
The gate's config file: the operator's `config`, with what the chart decides laid over it
(ports, workers, grace, the store's address or its secret references, the schedulers' addresses,
the API keys file). Secrets never enter it: only file paths and environment variable names.
*/}}
{{- define "llm-gate.config" -}}
{{- $v := .Values -}}
{{- $c := deepCopy ($v.config | default dict) -}}
{{- $server := get $c "server" | default dict -}}
{{- $_ := mustMergeOverwrite $server (dict "host" "0.0.0.0" "port" $v.gate.port "metrics_port" $v.gate.metricsPort "workers" $v.gate.workers "drain_seconds" $v.gate.drainSeconds "grace_seconds" $v.gate.graceSeconds) -}}
{{- $_ := set $c "server" $server -}}
{{- $store := get $c "store" | default dict -}}
{{- if eq $v.redis.mode "internal" -}}
{{- $_ := unset $store "redis" -}}
{{- $_ := set $store "redis_url" (printf "redis://%s-redis.%s.svc.cluster.local:%d/0" (include "llm-gate.fullname" .) .Release.Namespace (int $v.redis.internal.port)) -}}
{{- else if or $v.redis.existingSecret (hasKey $store "redis") -}}
{{- /* store.redis: the topology (single from redis.url, or Sentinel / Cluster as configured), the passwords by variable name */ -}}
{{- $redis := get $store "redis" | default (dict "mode" "single" "url" $v.redis.url) -}}
{{- if and $v.redis.existingSecret $v.redis.passwordKey -}}
{{- $_ := set $redis "password_env" "LLM_GATE_REDIS_PASSWORD" -}}
{{- end -}}
{{- if and $v.redis.existingSecret $v.redis.sentinelPasswordKey -}}
{{- $_ := set $redis "sentinel_password_env" "LLM_GATE_REDIS_SENTINEL_PASSWORD" -}}
{{- end -}}
{{- $_ := unset $store "redis_url" -}}
{{- $_ := set $store "redis" $redis -}}
{{- else -}}
{{- $_ := set $store "redis_url" $v.redis.url -}}
{{- end -}}
{{- $_ := set $c "store" $store -}}
{{- if $v.apiKeys.existingSecret -}}
{{- $identity := get $c "identity" | default dict -}}
{{- $_ := set $identity "api_keys_file" (printf "%s/%s" (include "llm-gate.apiKeysDir" .) $v.apiKeys.key) -}}
{{- $_ := set $c "identity" $identity -}}
{{- end -}}
{{- if $v.schedulers -}}
{{- $admission := get $c "admission" | default dict -}}
{{- $pools := get $admission "pools" | default dict -}}
{{- range $pool, $s := $v.schedulers -}}
{{- $p := get $pools $pool | default dict -}}
{{- $_ := set $p "scheduler" (printf "%s.%s.svc.cluster.local:%d" (include "llm-gate.schedulerName" (list $ $pool)) $.Release.Namespace (int $s.port)) -}}
{{- $_ := set $pools $pool $p -}}
{{- end -}}
{{- $_ := set $admission "pools" $pools -}}
{{- $_ := set $c "admission" $admission -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{/* One CPU per gate process, as a quantity ("1", "2", "1500m"). */}}
{{- define "llm-gate.gateCpu" -}}
{{- $per := toString .Values.gate.cpuPerWorker -}}
{{- $n := int .Values.gate.workers -}}
{{- if hasSuffix "m" $per -}}
{{- printf "%dm" (mul (trimSuffix "m" $per | int) $n) -}}
{{- else -}}
{{- printf "%d" (mul ($per | int) $n) -}}
{{- end -}}
{{- end -}}

{{- define "llm-gate.metricsPorts" -}}
{{- $ports := list -}}
{{- range $i := until (int .Values.gate.workers) -}}
{{- $ports = append $ports (toString (add $.Values.gate.metricsPort $i)) -}}
{{- end -}}
{{- join "," $ports -}}
{{- end -}}

{{/* The schedulers' distinct ports of one kind ("port" or "metricsPort"), comma-separated. */}}
{{- define "llm-gate.schedulerPorts" -}}
{{- $ports := list -}}
{{- range $pool, $s := (index . 0).Values.schedulers -}}
{{- $ports = append $ports (toString (get $s (index $ 1))) -}}
{{- end -}}
{{- $ports | uniq | join "," -}}
{{- end -}}


{{/* The pod labels that put a pod in the mesh (sidecar injection or ambient), when istio.enabled. */}}
{{- define "llm-gate.meshPodLabels" -}}
{{- if and .Values.istio.enabled .Values.istio.injection -}}
{{- if eq .Values.istio.dataplane "ambient" -}}
istio.io/dataplane-mode: ambient
{{- else -}}
sidecar.istio.io/inject: "true"
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the metrics ports bypass the sidecar (sidecar mode only). */}}
{{- define "llm-gate.metricsBypass" -}}
{{- if and .Values.istio.enabled .Values.istio.metricsOutsideMesh (ne .Values.istio.dataplane "ambient") -}}true{{- end -}}
{{- end -}}
