{{/*
Names, labels and the image every template shares. The chart's helpers are split by topic: _names.tpl,
_config.tpl (what the configs may ask for), _security.tpl, _pod.tpl (pod-spec pieces), _config-manager.tpl (how a
container gets its config), _gfd.tpl and _dra.tpl. Each decision is made in one of them, once.
*/}}

{{- define "nvdp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name alone when it already contains the chart's name (nvidia-device-plugin), as NVIDIA's. */}}
{{- define "nvdp.fullname" -}}
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

{{/* "<fullname>-<suffix>", kept within 63 characters. */}}
{{- define "nvdp.suffixed" -}}
{{- printf "%s-%s" (include "nvdp.fullname" .root) .suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nvdp.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "nvdp.serviceAccountName" -}}
{{- include "nvdp.suffixed" (dict "root" . "suffix" "service-account") -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "nvdp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: {{ include "nvdp.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The plugin DaemonSet's selector: NVIDIA's (name and instance), or selectorLabelsOverride. */}}
{{- define "nvdp.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride -}}
{{ toYaml .Values.selectorLabelsOverride }}
{{- else -}}
app.kubernetes.io/name: {{ include "nvdp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- end -}}

{{/* The selector of a DaemonSet of the release (plugin, GFD, MPS control daemon): NVIDIA's, the plugin's for all
three, with the component added when componentSelectorLabels.enabled (NVIDIA's switch, off by default because a
selector cannot change on an existing DaemonSet). */}}
{{- define "nvdp.daemonSetSelector" -}}
{{ include "nvdp.selectorLabels" .root }}
{{- if .root.Values.componentSelectorLabels.enabled }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/* Pod labels of a DaemonSet of the release: the selector's (NVIDIA's, shared by the plugin, GFD and MPS
DaemonSets, as NVIDIA's chart has them: a DaemonSet's selector cannot change, so an upgrade from NVIDIA's release
must keep it) and the component, which tells the three apart (Service, NetworkPolicy, kubectl -l). */}}
{{- define "nvdp.componentPodLabels" -}}
{{ include "nvdp.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The plugin pods' labels. */}}
{{- define "nvdp.podLabels" -}}
{{ include "nvdp.componentPodLabels" (dict "root" . "component" "device-plugin") }}
{{- end -}}

{{/* The one image of every container: repository:tag, tag defaulting to appVersion; a sha256: tag is a digest. */}}
{{- define "nvdp.image" -}}
{{- $tag := toString (default .Chart.AppVersion .Values.image.tag) -}}
{{- if hasPrefix "sha256:" $tag -}}
{{- printf "%s@%s" .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}
