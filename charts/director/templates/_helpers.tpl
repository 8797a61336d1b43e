{{/* The release's name for every object, at most 63 characters. */}}
{{- define "director.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "director.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The selector labels as key=value strings, for the runs' NetworkPolicy. */}}
{{- define "director.selectorLabelList" -}}
{{- $out := list -}}
{{- range $k, $v := include "director.selectorLabels" . | fromYaml -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- toJson (sortAlpha $out) -}}
{{- end -}}

{{- define "director.labels" -}}
{{ include "director.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "director.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "director.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "director.runsNamespace" -}}
{{- default .Release.Namespace .Values.runs.namespace -}}
{{- end -}}

{{- define "director.runsServiceAccountName" -}}
{{- if .Values.runs.serviceAccount.create -}}
{{- default (printf "%s-run" (include "director.fullname" .) | trunc 63 | trimSuffix "-") .Values.runs.serviceAccount.name -}}
{{- else -}}
{{- .Values.runs.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Whether the store is PostgreSQL: a storeUrl given here or in an existing Secret. */}}
{{- define "director.postgres" -}}
{{- $s := .Values.secrets.storeUrl -}}
{{- if or $s.value $s.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* The secret values the chart stores itself, by key. */}}
{{- define "director.ownSecrets" -}}
{{- $out := dict -}}
{{- range $name, $s := .Values.secrets -}}
{{- if and $s.value (not $s.existingSecret) -}}
{{- $_ := set $out $s.key $s.value -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The configuration file: the values' `config`, with what the chart decides merged over it.
Rendered by hand rather than with toToml, which writes every number as a float (3.0), and
the director's whole-number keys refuse floats.
*/}}
{{- define "director.config" -}}
{{- $files := dict "forgeToken" (list "forge" "token_file") "runnerPassword" (list "forge" "runner_password_file") "githubPrivateKey" (list "github" "private_key_file") "webhookSecrets" (list "webhook" "secrets_file") "preflightApiKey" (list "preflight" "api_key_file") "statusToken" (list "status" "token_file") "storeUrl" (list "store" "url_file") -}}
{{- $chart := dict "server" (dict "listen" (printf "0.0.0.0:%v" (int .Values.service.port)) "log_format" "json") "runner" (dict "kind" "kubernetes") "kubernetes" (dict "namespace" (include "director.runsNamespace" .) "kubeconfig" "" "service_account" (include "director.runsServiceAccountName" .) "ttl_secs_after_finished" (int .Values.runs.ttlSecondsAfterFinished) "proxy_host" (printf "%s.%s.svc" (include "director.fullname" .) .Release.Namespace) "proxy_namespace" .Release.Namespace "proxy_pod_labels" (include "director.selectorLabelList" . | fromJsonArray)) -}}
{{- $_ := set (index $chart "runner") "egress_proxy_port" (int .Values.runs.egressProxyPort) -}}
{{- $_ := set (index $chart "runner") "git_gateway_port" (int .Values.runs.gitGatewayPort) -}}
{{- $_ := set (index $chart "runner") "model_gateway_port" (int .Values.runs.modelGatewayPort) -}}
{{- range $k, $v := include "director.gatewaySizing" . | fromJson -}}
{{- $_ := set (index $chart "runner") $k $v -}}
{{- end -}}
{{- if not (include "director.postgres" .) -}}
{{- $_ := set $chart "store" (dict "url" "sqlite:///data/director.db") -}}
{{- end -}}
{{- range $name, $where := $files -}}
{{- $s := index $.Values.secrets $name -}}
{{- if or $s.value $s.existingSecret -}}
{{- $section := index $where 0 -}}
{{- if not (hasKey $chart $section) -}}{{- $_ := set $chart $section dict -}}{{- end -}}
{{- $_ := set (index $chart $section) (index $where 1) (printf "/run/secrets/director/%s" $s.key) -}}
{{- end -}}
{{- end -}}
{{- $secretKeys := dict "forge" (list "token" "runner_password" "token_file" "runner_password_file") "github" (list "private_key" "private_key_file") "webhook" (list "secrets" "secrets_file") "preflight" (list "api_key" "api_key_file") "status" (list "token" "token_file") "store" (list "url" "url_file") -}}
{{- range $section, $names := $secretKeys -}}
{{- $table := index (default dict $.Values.config) $section -}}
{{- if kindIs "map" $table -}}
{{- range $name := $names -}}
{{- if hasKey $table $name -}}
{{- fail (printf "config.%s.%s holds a secret (or its file), which a ConfigMap must not: give it under `secrets` (see the chart's README)" $section $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $config := mergeOverwrite (deepCopy (default dict .Values.config)) $chart -}}
{{- range $section := keys $config | sortAlpha }}
[{{ $section }}]
{{- $table := index $config $section }}
{{- if not (kindIs "map" $table) }}
{{- fail (printf "config.%s must be a table of keys (director.toml has sections only)" $section) }}
{{- end }}
{{- range $key := keys $table | sortAlpha }}
{{ $key }} = {{ include "director.tomlValue" (index $table $key) }}
{{- end }}
{{ end }}
{{- end -}}

{{- define "director.tomlValue" -}}
{{- if kindIs "string" . -}}
{{ toJson . }}
{{- else if kindIs "bool" . -}}
{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "float32" .) -}}
{{- if eq (float64 (int64 .)) (float64 .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if or (kindIs "int" .) (kindIs "int64" .) -}}
{{ . }}
{{- else if kindIs "slice" . -}}
[{{ range $i, $e := . }}{{ if $i }}, {{ end }}{{ include "director.tomlValue" $e }}{{ end }}]
{{- else if kindIs "invalid" . -}}
""
{{- else -}}
{{ fail (printf "config: a value of kind %s cannot go into director.toml" (kindOf .)) }}
{{- end -}}
{{- end -}}

{{/*
A Kubernetes quantity (512Mi, 1Gi, 4G, bytes) in MiB, rounded down; the chart's sizing
checks need a number. Fractions and milli-units are refused.
*/}}
{{- define "director.mebibytes" -}}
{{- $q := toString (index . 1) -}}
{{- if not (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q) -}}
{{- fail (printf "%s (%s) must be a whole quantity (512Mi, 1Gi, 4G) for the chart to check the director's sizing" (index . 0) $q) -}}
{{- end -}}
{{- $n := int64 (regexFind "^[0-9]+" $q) -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" $q) $q -}}
{{- $bytes := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $per := int64 (index $bytes $unit) -}}
{{- if ge $per 1048576 -}}
{{- mul $n (div $per 1048576) -}}
{{- else -}}
{{- div (mul $n $per) 1048576 -}}
{{- end -}}
{{- end -}}

{{/*
What the chart decides of the gateways' sizing, checked against the pod's resources and
volumes (a JSON object: gateway_dir, gateway_disk_mb). The same rules as the director's: the
body memory (config.runner.gateway_memory_mb, else a quarter of the memory limit, at most
512) holds one push of max_push_mb, and is at most a quarter of the limit; the disk cap is
below the gateway volume and holds two pushes.
*/}}
{{- define "director.gatewaySizing" -}}
{{- $runner := default dict (index (default dict .Values.config) "runner") -}}
{{- if hasKey $runner "gateway_dir" -}}
{{- fail "config.runner.gateway_dir is the chart's: it points at the gatewayStorage volume" -}}
{{- end -}}
{{- $maxPush := int64 (default 100 (index $runner "max_push_mb")) -}}
{{- $limit := dig "limits" "memory" "" (default dict .Values.resources) -}}
{{- $memory := int64 512 -}}
{{- if hasKey $runner "gateway_memory_mb" -}}
{{- $memory = int64 (index $runner "gateway_memory_mb") -}}
{{- else if $limit -}}
{{- $memory = min 512 (div (int64 (include "director.mebibytes" (list "resources.limits.memory" $limit))) 4) -}}
{{- end -}}
{{- if $limit -}}
{{- $limitMi := int64 (include "director.mebibytes" (list "resources.limits.memory" $limit)) -}}
{{- if gt (mul $memory 4) $limitMi -}}
{{- fail (printf "config.runner.gateway_memory_mb (%d MB) is more than a quarter of resources.limits.memory (%s): the bodies, the git that checks them and the director itself would not fit" $memory $limit) -}}
{{- end -}}
{{- end -}}
{{- if gt $maxPush $memory -}}
{{- fail (printf "config.runner.max_push_mb (%d MB) is more than the gateways' body memory (%d MB: config.runner.gateway_memory_mb, else a quarter of resources.limits.memory %s): raise the limit or lower max_push_mb" $maxPush $memory (default "unset" $limit)) -}}
{{- end -}}
{{- $volumeMi := int64 (include "director.mebibytes" (list "gatewayStorage.size" .Values.gatewayStorage.size)) -}}
{{- $disk := div (mul $volumeMi 3) 4 -}}
{{- if hasKey $runner "gateway_disk_mb" -}}
{{- $disk = int64 (index $runner "gateway_disk_mb") -}}
{{- end -}}
{{- if ge $disk $volumeMi -}}
{{- fail (printf "config.runner.gateway_disk_mb (%d MB) must be below gatewayStorage.size (%s): the volume would fill and the pod be evicted" $disk .Values.gatewayStorage.size) -}}
{{- end -}}
{{- if lt $disk (mul $maxPush 2) -}}
{{- fail (printf "config.runner.gateway_disk_mb (%d MB, from gatewayStorage.size %s) cannot hold two pushes of config.runner.max_push_mb (%d MB)" $disk .Values.gatewayStorage.size $maxPush) -}}
{{- end -}}
{{- toJson (dict "gateway_dir" "/var/cache/director-gateway" "gateway_disk_mb" $disk) -}}
{{- end -}}
