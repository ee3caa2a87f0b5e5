// The chat page's conversation kept across reloads. After each reply the engine's saved
// conversation (its KV cache, with the page's messages as its note) goes into the private file
// system under the model's name. A later load of that model restores it, so the chat goes on
// where it was without the model reading it again. A saved conversation the engine refuses
// (another model, engine version or KV-cache kind, a damaged file) is deleted.

const FOLDER = 'emberlm-conversations';

/** The folder, or null where the page has no private file system. */
async function folder() {
  if (!navigator.storage?.getDirectory) return null;
  const root = await navigator.storage.getDirectory();
  return root.getDirectoryHandle(FOLDER, { create: true });
}

const fileName = (model) => `${encodeURIComponent(model)}.kv`;

/**
 * Saves the conversation of `client` under `model`, with `messages` as they are now (the save
 * is queued at once, before any later call); false when it could not.
 */
export async function keepConversation(client, model, messages) {
  if (!navigator.storage?.getDirectory) return false;
  const saving = client.saveConversation({ messages: messages.slice() });
  try {
    const bytes = await saving;
    const dir = await folder();
    if (!dir) return false;
    const writable = await (await dir.getFileHandle(fileName(model), { create: true })).createWritable();
    await writable.write(bytes);
    await writable.close();
    return true;
  } catch (e) {
    console.warn(`emberlm: the conversation was not kept: ${e.message ?? e}`);
    return false;
  }
}

/** Restores the conversation kept under `model` into `client`: its messages, or null. */
export async function restoreConversation(client, model) {
  let bytes;
  try {
    const dir = await folder();
    if (!dir) return null;
    const file = await (await dir.getFileHandle(fileName(model))).getFile();
    bytes = new Uint8Array(await file.arrayBuffer());
  } catch {
    return null; // none kept
  }
  try {
    const restored = await client.restoreConversation(bytes);
    return Array.isArray(restored.note?.messages) ? restored.note.messages : null;
  } catch (e) {
    console.warn(`emberlm: the kept conversation was not restored: ${e.message ?? e}`);
    await forgetConversation(model);
    return null;
  }
}

/** Deletes the conversation kept under `model`. */
export async function forgetConversation(model) {
  try {
    await (await folder())?.removeEntry(fileName(model));
  } catch {
    // nothing kept
  }
}
