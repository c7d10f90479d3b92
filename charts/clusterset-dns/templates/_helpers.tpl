{{/* Object names: the release name, with the chart name appended unless it is in it. */}}
{{- define "clusterset-dns.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "clusterset-dns.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "clusterset-dns.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The subcommand the pods run, also their app.kubernetes.io/component. */}}
{{- define "clusterset-dns.component" -}}
{{- if has .Values.shape (list "sync" "agent") }}{{ .Values.shape }}{{ else }}serve{{ end -}}
{{- end -}}

{{/* The Deployment's (and its Service's) name. */}}
{{- define "clusterset-dns.workloadName" -}}
{{- $full := include "clusterset-dns.fullname" . -}}
{{- if has .Values.shape (list "sync" "agent") }}{{ $full }}-{{ .Values.shape }}{{ else }}{{ $full }}{{ end -}}
{{- end -}}

{{/* Selector labels: stable for the life of a release. $ctx: (dict "root" $ "component" "...") */}}
{{- define "clusterset-dns.selectorLabels" -}}
app.kubernetes.io/name: {{ include "clusterset-dns.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "clusterset-dns.labels" -}}
{{ include "clusterset-dns.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The port of an ADDR:PORT value. */}}
{{- define "clusterset-dns.port" -}}
{{- regexReplaceAll "^.*:" (toString .) "" -}}
{{- end -}}

{{/*
Flags from a map of values: key fooBar is flag --foo-bar; null or an empty
list leaves the flag out (the binary's default), a list repeats it, the
switches (no argument) appear when true. Sorted by key.
*/}}
{{- define "clusterset-dns.flags" -}}
{{- $switches := list "hideVersion" "endpointAnswers" "probe" "noLeaderElection" "metricsPerService" -}}
{{- range $key := keys .values | sortAlpha }}
{{- if not (has $key $.skip) }}
{{- $v := get $.values $key }}
{{- $flag := printf "--%s" (regexReplaceAll "([a-z0-9])([A-Z])" $key "${1}-${2}" | lower) }}
{{- if has $key $switches }}
{{- if $v }}
- {{ $flag }}
{{- end }}
{{- else if kindIs "slice" $v }}
{{- range $v }}
- {{ $flag }}
- {{ include "clusterset-dns.arg" . }}
{{- end }}
{{- else if not (kindIs "invalid" $v) }}
- {{ $flag }}
- {{ include "clusterset-dns.arg" $v }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* One argument, quoted; whole numbers without an exponent (YAML numbers arrive as float64), fractions as they are (0.5). */}}
{{- define "clusterset-dns.arg" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) }}{{ int64 . | toString | quote }}{{ else }}{{ toString . | quote }}{{ end -}}
{{- end -}}

{{/* Values that make no sense fail here, naming the value. */}}
{{- define "clusterset-dns.validate" -}}
{{- $shape := .Values.shape -}}
{{- if not (has $shape (list "serve" "sync" "centralized" "agent")) -}}
{{- fail (printf "shape: %q is not a shape; use serve, sync, centralized or agent" (toString $shape)) -}}
{{- end -}}
{{- $controller := has $shape (list "sync" "agent") -}}
{{- if and .Values.workload.enabled (not $controller) .Values.podDisruptionBudget.enabled (not .Values.autoscaling.enabled) -}}
{{- if le (int .Values.replicas) (int .Values.podDisruptionBudget.minAvailable) -}}
{{- fail (printf "replicas: %v with podDisruptionBudget.minAvailable: %v: the PodDisruptionBudget would block every node drain; use replicas of at least %v, or podDisruptionBudget.enabled: false" .Values.replicas .Values.podDisruptionBudget.minAvailable (add1 (int .Values.podDisruptionBudget.minAvailable))) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (le (int .Values.autoscaling.minReplicas) (int .Values.podDisruptionBudget.minAvailable)) .Values.podDisruptionBudget.enabled -}}
{{- fail (printf "autoscaling.minReplicas: %v with podDisruptionBudget.minAvailable: %v: the PodDisruptionBudget would block every node drain" .Values.autoscaling.minReplicas .Values.podDisruptionBudget.minAvailable) -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled $controller -}}
{{- fail (printf "autoscaling.enabled: %s has one leader at a time; more replicas add standbys, not capacity" $shape) -}}
{{- end -}}
{{- if and (eq $shape "agent") .Values.workload.enabled (not .Values.agent.member) -}}
{{- fail "agent.member: empty; shape agent needs this member's name on the hub, as enrolled (`clusterset-dns hub enrol NAME`)" -}}
{{- end -}}
{{- if and (eq $shape "agent") .Values.agent.noLeaderElection (gt (int .Values.replicas) 1) -}}
{{- fail (printf "agent.noLeaderElection: true with replicas: %v: without leader election only one replica may run" .Values.replicas) -}}
{{- end -}}
{{- if and (eq $shape "sync") .Values.sync.noLeaderElection (gt (int (.Values.sync.shards | default 1)) 1) -}}
{{- fail (printf "sync.shards: %v with sync.noLeaderElection: true: shards are led on Leases" .Values.sync.shards) -}}
{{- end -}}
{{- if and (eq $shape "sync") .Values.sync.noLeaderElection (gt (int .Values.replicas) 1) -}}
{{- fail (printf "sync.noLeaderElection: true with replicas: %v: without leader election only one replica may run" .Values.replicas) -}}
{{- end -}}
{{- $lameduck := .Values.serve.lameduck | default 5 -}}
{{- if and (not $controller) (ge (int $lameduck) (int .Values.terminationGracePeriodSeconds)) -}}
{{- fail (printf "serve.lameduck: %v is not below terminationGracePeriodSeconds: %v; the pod would be killed while it still answers" $lameduck .Values.terminationGracePeriodSeconds) -}}
{{- end -}}
{{- end -}}
