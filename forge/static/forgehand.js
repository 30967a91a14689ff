// Small progressive enhancements; every page works without this file.
// Copy buttons: <button data-copy="#id" aria-label="..."> copies that element's text with the
// clipboard API and says so in the nearest [data-copy-status] live region.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  const status = document.querySelector(button.dataset.copyStatus || "[data-copy-status]");
  if (!source) return;
  try {
    await navigator.clipboard.writeText(source.textContent.trim());
    if (status) status.textContent = "Copied to the clipboard.";
  } catch (err) {
    if (status) status.textContent = "Copying failed: select the text and copy it yourself.";
  }
});
