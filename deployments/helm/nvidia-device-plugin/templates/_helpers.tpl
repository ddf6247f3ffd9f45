{{/*
Names, labels, the image, and the decisions every template shares. Each decision is made here once.
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

{{/* The plugin pods' labels: the selector's and the component. */}}
{{- define "nvdp.podLabels" -}}
{{ include "nvdp.selectorLabels" . }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{/* Selector of another DaemonSet of the release (component: mps-control-daemon, gpu-feature-discovery): a name
of its own, so that the plugin's selector never matches its pods. */}}
{{- define "nvdp.componentSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-%s" (include "nvdp.name" .root) .component | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
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

{{/* ---- what the configs may ask for ---------------------------------------------------------------------
With config.map the chart reads each config and knows; with config.name (a ConfigMap the chart cannot read) it
assumes the config may ask for anything. NVIDIA's chart assumes that for config.map too. */}}

{{- define "nvdp.hasConfig" -}}
{{- if or .Values.config.name (not (empty .Values.config.map)) -}}true{{- end -}}
{{- end -}}

{{- define "nvdp.configMapName" -}}
{{- if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else if not (empty .Values.config.map) -}}
{{- include "nvdp.suffixed" (dict "root" . "suffix" "configs") -}}
{{- end -}}
{{- end -}}

{{/* The device-list strategies of the values and of every config in config.map, as one comma-joined string. */}}
{{- define "nvdp.listStrategies" -}}
{{- $found := list (toString (default "" .Values.deviceListStrategy)) -}}
{{- range $name, $text := .Values.config.map -}}
{{- $plugin := dig "flags" "plugin" dict (fromYaml $text) -}}
{{- $strategy := get $plugin "deviceListStrategy" -}}
{{- if kindIs "slice" $strategy -}}
{{- $found = concat $found $strategy -}}
{{- else if $strategy -}}
{{- $found = append $found (toString $strategy) -}}
{{- end -}}
{{- end -}}
{{- join "," $found -}}
{{- end -}}

{{/* "true" when some node may run a MIG strategy other than none. */}}
{{- define "nvdp.mayUseMig" -}}
{{- if .Values.migStrategy -}}
{{- if ne (toString .Values.migStrategy) "none" -}}true{{- end -}}
{{- else if .Values.config.name -}}true
{{- else -}}
{{- range $name, $text := .Values.config.map -}}
{{- $mig := dig "flags" "migStrategy" "none" (fromYaml $text) -}}
{{- if ne (toString $mig) "none" -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when some config may share GPUs through MPS. */}}
{{- define "nvdp.mayUseMps" -}}
{{- if .Values.config.name -}}true
{{- else -}}
{{- range $name, $text := .Values.config.map -}}
{{- if dig "sharing" "mps" "" (fromYaml $text) -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when a CDI device-list strategy may be used (the plugin then writes CDI specs). */}}
{{- define "nvdp.mayUseCdi" -}}
{{- if or .Values.config.name (contains "cdi" (include "nvdp.listStrategies" .)) -}}true{{- end -}}
{{- end -}}

{{/* NVIDIA's rule: SYS_ADMIN (and NVIDIA_MIG_MONITOR_DEVICES) where MIG is possible or volume-mounts is used. */}}
{{- define "nvdp.needsSysAdmin" -}}
{{- if or (include "nvdp.mayUseMig" .) (contains "volume-mounts" (include "nvdp.listStrategies" .)) -}}true{{- end -}}
{{- end -}}

{{/* ---- security contexts and resources: a value set by the user is used as it is ------------------------ */}}

{{- define "nvdp.podSecurityContext" -}}
{{- if .Values.podSecurityContext -}}
{{ toYaml .Values.podSecurityContext }}
{{- else -}}
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- end -}}

{{/* .context: the user's value; .root: the chart. */}}
{{- define "nvdp.containerSecurityContext" -}}
{{- if .context -}}
{{ toYaml .context }}
{{- else if .root.Values.compatWithCPUManager -}}
privileged: true
{{- else -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
  {{- if include "nvdp.needsSysAdmin" .root }}
  add: ["SYS_ADMIN"]
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "nvdp.resources" -}}
{{- if .value -}}
{{ toYaml .value }}
{{- else -}}
requests:
  cpu: {{ .cpu }}
  memory: {{ .memory }}
limits:
  memory: {{ .limit }}
{{- end -}}
{{- end -}}

{{/* ---- pieces of the pod spec every DaemonSet shares ---------------------------------------------------------- */}}

{{- define "nvdp.podScheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "nvdp.hostNetwork" -}}
{{- if . }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end -}}

{{/* The NVIDIA flags that are set (typeIs: null means "leave it to the config"), as env entries. */}}
{{- define "nvdp.flagEnv" -}}
{{- $strings := dict "MIG_STRATEGY" .Values.migStrategy "DEVICE_LIST_STRATEGY" .Values.deviceListStrategy "DEVICE_ID_STRATEGY" .Values.deviceIDStrategy "NVIDIA_DEV_ROOT" .Values.nvidiaDevRoot "NVIDIA_CDI_HOOK_PATH" .Values.cdi.nvidiaHookPath "CDI_FEATURE_FLAGS" .Values.cdi.featureFlags "DEVICE_DISCOVERY_STRATEGY" .Values.deviceDiscoveryStrategy -}}
{{- $bools := dict "FAIL_ON_INIT_ERROR" .Values.failOnInitError "PASS_DEVICE_SPECS" .Values.compatWithCPUManager "GDRCOPY_ENABLED" .Values.gdrcopyEnabled "GDS_ENABLED" .Values.gdsEnabled "MOFED_ENABLED" .Values.mofedEnabled -}}
{{- range $name := keys $strings | sortAlpha }}
{{- $value := get $strings $name }}
{{- if typeIs "string" $value }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- range $name := keys $bools | sortAlpha }}
{{- $value := get $bools $name }}
{{- if typeIs "bool" $value }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* How one main container gets its config: "" (no config), "config-manager" (reads the link config-manager
keeps), "in-process" (follows the label itself: `run` only; the MPS and GFD daemons then use config-manager) or
"node-name". .root: the chart; .component: device-plugin, mps-control-daemon or gpu-feature-discovery. */}}
{{- define "nvdp.configMode" -}}
{{- if include "nvdp.hasConfig" .root -}}
{{- $selection := .root.Values.config.selection -}}
{{- if and (eq $selection "in-process") (ne .component "device-plugin") -}}
config-manager
{{- else -}}
{{- $selection -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The config flags of a main container (args of run, mps-control-daemon, gpu-feature-discovery). */}}
{{- define "nvdp.configArgs" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- $config := .root.Values.config }}
{{- if eq $mode "config-manager" }}
- --config-file=/config/config.yaml
{{- else if $mode }}
- --config-dir=/available-configs
{{- with $config.default }}
- --config-default={{ . }}
{{- end }}
- --config-fallback-strategies={{ join "," $config.fallbackStrategies }}
{{- if eq $mode "in-process" }}
- --node-config-label={{ $config.nodeLabel }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Env that goes with nvdp.configArgs; NODE_NAME also where the main container calls the API itself (.api:
GFD's NodeFeature API, the DRA mode). */}}
{{- define "nvdp.configEnv" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- if eq $mode "node-name" }}
# A key named after the node wins over the default: per-node configs without API access.
- name: NVDP_CONFIG_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- if or (eq $mode "in-process") .api }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- end -}}

{{/* The config mounts of a main container, and the API token where it calls the API itself (.api). */}}
{{- define "nvdp.configMounts" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- if $mode }}
- name: available-configs
  mountPath: /available-configs
  readOnly: true
{{- end }}
{{- if eq $mode "config-manager" }}
- name: config
  mountPath: /config
  readOnly: true
{{- end }}
{{- if or (eq $mode "in-process") .api }}
- name: kube-api-access
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end }}
{{- end -}}

{{/* The config volumes of one DaemonSet, and the API token's where its main container calls the API (.api). */}}
{{- define "nvdp.configVolumes" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- if $mode }}
- name: available-configs
  configMap:
    name: {{ include "nvdp.configMapName" .root }}
{{- end }}
{{- if eq $mode "config-manager" }}
# The link config-manager points at the chosen key; the main container reads it.
- name: config
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if or (and $mode (ne $mode "node-name")) .api }}
# What automountServiceAccountToken would mount, for the containers of this pod that call the API alone.
- name: kube-api-access
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                fieldPath: metadata.namespace
{{- end }}
{{- end -}}

{{/* "true" when the release reads node labels through the API (and so needs its ClusterRole). */}}
{{- define "nvdp.readsNodeLabels" -}}
{{- if and (include "nvdp.hasConfig" .) (ne .Values.config.selection "node-name") -}}true{{- end -}}
{{- end -}}

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

{{/* ---- the DRA mode (ours) ------------------------------------------------------------------------------------ */}}

{{/* "true" when the plugin may serve DRA: dra.enabled, or a config in config.map that turns it on (a ConfigMap
named by config.name is not assumed to: DRA's rights are cluster-wide writes, so they are asked for by value). */}}
{{- define "nvdp.mayUseDra" -}}
{{- if eq (toString .Values.dra.enabled) "true" -}}true
{{- else -}}
{{- range $name, $text := .Values.config.map -}}
{{- if eq (toString (dig "dra" "enabled" false (fromYaml $text))) "true" -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* dra.gpus as NVDP_DRA_GPUS takes it: "all", or the indices and UUIDs comma-joined; empty when unset. */}}
{{- define "nvdp.draGpus" -}}
{{- $gpus := .Values.dra.gpus -}}
{{- if kindIs "slice" $gpus -}}
{{- join "," $gpus -}}
{{- else if not (kindIs "invalid" $gpus) -}}
{{- toString $gpus -}}
{{- end -}}
{{- end -}}

{{/* One config-manager container. .root: the chart; .name: the container's name; .oneshot: init or sidecar. */}}
{{- define "nvdp.configManagerContainer" -}}
- name: {{ .name }}
  image: {{ include "nvdp.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["config-manager"]
  env:
    - name: ONESHOT
      value: {{ .oneshot | quote }}
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: NODE_LABEL
      value: {{ .root.Values.config.nodeLabel | quote }}
    - name: CONFIG_FILE_SRCDIR
      value: /available-configs
    - name: CONFIG_FILE_DST
      value: /config/config.yaml
    - name: DEFAULT_CONFIG
      value: {{ .root.Values.config.default | quote }}
    # Both set here, as NVIDIA's chart sets them: config-manager's own defaults are its binary's (no fallback
    # strategies, SEND_SIGNAL true). The plugin reloads a re-pointed link by itself: no signal, no shared
    # process namespace.
    - name: FALLBACK_STRATEGIES
      value: {{ join "," .root.Values.config.fallbackStrategies | quote }}
    - name: SEND_SIGNAL
      value: "false"
  securityContext:
    {{- if .root.Values.configManager.securityContext }}
    {{- toYaml .root.Values.configManager.securityContext | nindent 4 }}
    {{- else }}
    runAsUser: 65534
    runAsGroup: 65534
    runAsNonRoot: true
    privileged: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
    {{- end }}
  resources:
    {{- include "nvdp.resources" (dict "value" .root.Values.configManager.resources "cpu" "10m" "memory" "64Mi" "limit" "128Mi") | nindent 4 }}
  volumeMounts:
    - name: available-configs
      mountPath: /available-configs
      readOnly: true
    - name: config
      mountPath: /config
    - name: kube-api-access
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
{{- end -}}

{{/* A read-only root filesystem needs a writable /tmp (MPS control commands and the simulator use it). */}}
{{- define "nvdp.tmpVolume" -}}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- end -}}
