{{/* The app name: the chart's, or nameOverride. */}}
{{- define "kdh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: fullnameOverride, else the release name if it contains the app name,
else "<release>-<app>". Release "kubelet-dra-health" gives the names of deploy/. */}}
{{- define "kdh.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "kdh.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels of every object: deploy/'s app.kubernetes.io/name plus Helm's standard ones. */}}
{{- define "kdh.labels" -}}
app.kubernetes.io/name: {{ include "kdh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The DaemonSet's selector: only the app name, as in deploy/ (a selector cannot change). */}}
{{- define "kdh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kdh.name" . }}
{{- end }}

{{/* The service account, as the API server names its user (the admission policy matches it). */}}
{{- define "kdh.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "kdh.fullname" .) }}
{{- end }}

{{- define "kdh.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the taint bridge is on. */}}
{{- define "kdh.taintEnabled" -}}
{{- if and .Values.taint.effect (ne (toString .Values.taint.effect) "off") }}true{{ end }}
{{- end }}

{{/* An environment variable from an optional value: rendered only when the value is set
(not null). Numbers are written as the sidecar parses them. */}}
{{- define "kdh.optionalEnv" -}}
{{- $value := index . 1 }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ index . 0 }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end }}

{{/* The kubelet's PodResources socket in the container ("" when not mounted). */}}
{{- define "kdh.podResourcesSocket" -}}
{{- if .Values.paths.podResources }}{{ printf "%s/kubelet.sock" (trimSuffix "/" .Values.paths.podResources) }}{{ end -}}
{{- end }}
