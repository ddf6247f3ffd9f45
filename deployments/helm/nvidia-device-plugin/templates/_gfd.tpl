{{/* ---- GPU Feature Discovery's DaemonSet: its namespace, its own ServiceAccount and its output ------------- */}}

{{- define "nvdp.gfdNamespace" -}}
{{- default (include "nvdp.namespace" .) .Values.gfd.namespaceOverride -}}
{{- end -}}

{{/* GFD's pods run under an account of their own, in their namespace: its rights (the NodeFeature object) are
not the plugin's, and the plugin's (DRA) are not GFD's. */}}
{{- define "nvdp.gfdServiceAccountName" -}}
{{- include "nvdp.suffixed" (dict "root" . "suffix" "gpu-feature-discovery") -}}
{{- end -}}

{{/* "true" when GFD publishes through NFD's NodeFeature API: nfd.enableNodeFeatureApi true or unset (GFD v0.20's
default); false writes NFD's features.d file instead. */}}
{{- define "nvdp.gfdUsesNodeFeatureApi" -}}
{{- $api := .Values.nfd.enableNodeFeatureApi -}}
{{- if and .Values.gfd.enabled (or (kindIs "invalid" $api) (eq (toString $api) "true")) -}}true{{- end -}}
{{- end -}}
